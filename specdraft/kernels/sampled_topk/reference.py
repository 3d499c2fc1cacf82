"""Sampled children, the spec: each expanded node's first child sampled from the draft's q = softmax(logits / T)
by Gumbel-max, scored 0 (certain), then the k - 1 most probable tokens besides it, scored their log q
(decoding/sampled_drafts.py says why).

A row whose log-softmax has no finite normaliser (a NaN or +inf logit, or every logit -inf: a broken draft) is
untrusted: its k scores are -inf (children no tree selects: padding), its children draft indices 0..k-1, the
sampled one index 0, and its log q the point mass there (log q 0 at index 0, -inf elsewhere), so that a chain's
sampled token from it is verified as the point mass it then is: lossless, whatever the draft returned."""
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
    trusted = torch.isfinite(logprobs.gather(-1, sampled))  # [r, 1] finite iff the row's normaliser is
    sampled = torch.where(trusted, sampled, 0)
    point_mass = torch.where(torch.arange(logprobs.shape[1], device=logprobs.device) == sampled, 0.0, float("-inf"))
    logprobs = torch.where(trusted, logprobs, point_mass)  # [r, Vd]
    # the sampled token ranked first at +inf, then the k - 1 most probable others: one top-k; its score +inf
    # clamps to 0 (every log q is <= 0, so the others keep theirs)
    scores, ids = logprobs.scatter(-1, sampled, float("inf")).topk(k, dim=-1)  # [r, k] each
    ids = torch.where(trusted, ids, torch.arange(k, device=ids.device))
    if logprobs_out is not None:
        logprobs = logprobs_out.copy_(logprobs)
    return torch.where(trusted, scores.clamp(max=0.0), float("-inf")), ids + d2t[ids], logprobs
