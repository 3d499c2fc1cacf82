"""A plain, correct chain speculative decoder (batch 1, greedy) on a Hugging Face target.

Each cycle: the method drafts k tokens from the target features of every confirmed token; the target checks
[newest token, k drafts] in one cached forward; the longest prefix that matches the target's argmax is
accepted, plus the target's own next token (the bonus). The target's KV cache is cropped to the confirmed
tokens. The output is the target's greedy output by construction; the evaluator checks it anyway.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from specdraft.methods.base import ChainState, TargetFeatures


@dataclass
class ChainResult:
    tokens: List[int]  # generated token ids (prompt excluded), cut at EOS (kept) or max_new_tokens
    accepted: List[int] = field(default_factory=list)  # drafted tokens accepted, per cycle


def _append(features: Dict[int, torch.Tensor], hidden_states, count: int) -> None:
    for index in features:  # keep the first `count` positions of this forward: [1, count, H]
        features[index] = torch.cat([features[index], hidden_states[index][:, :count]], dim=1)


def _finish(generated: List[int], eos_ids: Sequence[int], max_new_tokens: int) -> tuple[List[int], bool]:
    for position, token in enumerate(generated[:max_new_tokens]):
        if token in eos_ids:
            return generated[: position + 1], True
    return generated[:max_new_tokens], len(generated) >= max_new_tokens


@torch.no_grad()
def chain_generate(target, propose: Callable[[ChainState, int], torch.Tensor], layers: Sequence[int],
                   prompt_ids: torch.Tensor, max_new_tokens: int, num_draft: int,
                   eos_ids: Sequence[int]) -> ChainResult:
    """prompt_ids [1, P] -> greedy continuation, drafting `num_draft` tokens per cycle with `propose`."""
    out = target(input_ids=prompt_ids, use_cache=True, output_hidden_states=True)
    cache = out.past_key_values
    features = {i: out.hidden_states[i] for i in sorted(set(layers) | {0})}  # [1, P, H]
    tokens = torch.cat([prompt_ids[0], out.logits[0, -1:].argmax(-1)])  # [P + 1]
    generated, accepted_counts = [int(tokens[-1])], []
    embed = target.get_input_embeddings()
    while True:
        generated, done = _finish(generated, eos_ids, max_new_tokens)
        if done:
            return ChainResult(tokens=generated, accepted=accepted_counts)
        state = ChainState(tokens=tokens[None], features=TargetFeatures(hidden_states=features), embed=embed)
        drafted = propose(state, num_draft)  # [k]
        verify_ids = torch.cat([tokens[-1:], drafted])[None]  # [1, k + 1]
        out = target(input_ids=verify_ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
        target_next = out.logits[0].argmax(-1)  # [k + 1]
        accepted = int((drafted == target_next[:-1]).int().cumprod(0).sum())
        _append(features, out.hidden_states, accepted + 1)
        if accepted < num_draft:  # drop the rejected drafts' entries (a negative count removes them)
            cache.crop(accepted - num_draft)
        new_tokens = torch.cat([drafted[:accepted], target_next[accepted:accepted + 1]])
        tokens = torch.cat([tokens, new_tokens])
        generated += new_tokens.tolist()
        accepted_counts.append(accepted)


def acceptance_by_position(accepted: Sequence[int], num_draft: int,
                           drafted: Optional[Sequence[int]] = None) -> List[float]:
    """P(draft i accepted | drafts < i accepted), i = 1..k, over cycles; with `drafted` (chains whose length
    varies per cycle, e.g. under a confidence exit) only over the cycles that drafted position i."""
    drafted = [num_draft] * len(accepted) if drafted is None else drafted
    rates = []
    for position in range(num_draft):
        reached = [a for a, d in zip(accepted, drafted) if a >= position and d > position]
        rates.append(sum(1 for a in reached if a > position) / len(reached) if reached else 0.0)
    return rates
