"""Sampled children, the spec: each expanded node's first child sampled from the draft's q = softmax(logits / T)
by Gumbel-max, scored 0 (certain), then the k - 1 most probable tokens besides it, scored their log q
(decoding/sampled_drafts.py says why)."""
from typing import Optional

import torch

from specdraft.kernels.temperature import scaled_logits


def sampled_topk_reference(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int, exponential: torch.Tensor,
                           temperature: float, logprobs_out: Optional[torch.Tensor] = None):
    """draft_logits [r, Vd], d2t [Vd] int64, exponential [r, Vd] float32 Exp(1) draws (-log of each a standard
    Gumbel draw) -> (scores [r, k] float32, target ids [r, k] int64, log q [r, Vd] float32, in `logprobs_out` when
    one is given)."""
    logprobs = torch.log_softmax(scaled_logits(draft_logits, temperature), dim=-1, dtype=torch.float32)  # [r, Vd]
    sampled = (logprobs - exponential.log()).argmax(dim=-1, keepdim=True)  # [r, 1] Gumbel-max
    # the sampled token ranked first at +inf, then the k - 1 most probable others: one top-k; its score +inf
    # clamps to 0 (every log q is <= 0, so the others keep theirs)
    scores, ids = logprobs.scatter(-1, sampled, float("inf")).topk(k, dim=-1)  # [r, k] each
    if logprobs_out is not None:
        logprobs = logprobs_out.copy_(logprobs)
    return scores.clamp(max=0.0), ids + d2t[ids], logprobs
