"""The first token of one T=1 cycle, drawn again and again from the same prefilled state: the samples that the
chi-square tests compare with the target's distribution after the prompt."""
from __future__ import annotations

from typing import List, Tuple

import torch


def first_tokens(engine, prompt: List[int], trials: int) -> Tuple[int, torch.Tensor]:
    """Prefill at T=0, then one cycle at T=1 from the same state, `trials` times -> (root, first tokens). Each trial
    restores every state tensor and, under a drafting policy, the policy's view of the sequence."""
    generator, firsts = torch.Generator().manual_seed(0), []
    root = engine.prefill(torch.tensor(prompt), 0.0)
    saved = [t.clone() for t in engine.state_tensors()]
    for _ in range(trials):
        for tensor, value in zip(engine.state_tensors(), saved):
            tensor.copy_(value)
        if engine.policy is not None:
            engine.policy.begin(prompt)
            engine.policy.observe([root])
        firsts.append(int(engine.cycle(1.0, generator).output.emitted[0]))
    return root, torch.tensor(firsts)


def first_tokens_from_prefix(engine, prompt: List[int], trials: int) -> Tuple[int, torch.Tensor]:
    """As first_tokens, restoring the prefix length and the root alone: enough where a cycle writes cache slots from
    the prefix on only and the drafter keeps no other state between cycles."""
    generator, firsts = torch.Generator().manual_seed(0), []
    root = engine.prefill(torch.tensor(prompt), 0.0)
    saved = [engine.prefix_len.clone(), engine.root.clone()]
    for _ in range(trials):
        engine.prefix_len.copy_(saved[0])
        engine.root.copy_(saved[1])
        firsts.append(int(engine.cycle(1.0, generator).output.emitted[0]))
    return root, torch.tensor(firsts)


SAMPLING_TRIALS, TOP, CRITICAL = 400, 4, 18.5  # chi-square, TOP + 1 bins (4 degrees of freedom), p = 0.001


def chi_square_top(samples, probs):
    """Chi-square of samples against probs [V] over the TOP most likely tokens and one bin for the rest."""
    top = probs.topk(TOP).indices
    expected = torch.cat([probs[top], 1 - probs[top].sum(0, keepdim=True)]) * samples.shape[0]
    counts = torch.stack([(samples == t).sum() for t in top] + [(~torch.isin(samples, top)).sum()]).float()
    return float(((counts - expected) ** 2 / expected).sum())
