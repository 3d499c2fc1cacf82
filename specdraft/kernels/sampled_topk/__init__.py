"""`sampled_topk`: at T > 0, each expanded node's children: one sampled from the draft's q by Gumbel-max (scored 0),
then the k - 1 most probable tokens besides it (scored their log q), mapped to target ids, and log q itself for the
verify; two launches.

Dispatch: the Triton kernels when `use_triton(draft_logits)`, else the reference (tests/kernels/
test_sampled_topk.py checks that both compute the same function).
"""
from typing import Optional

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.sampled_topk.reference import sampled_topk_reference


def sampled_topk(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int, exponential: torch.Tensor,
                 temperature: float, logprobs_out: Optional[torch.Tensor] = None):
    """draft_logits [r, Vd], d2t [Vd] int64, exponential [r, Vd] float32 Exp(1) draws -> (scores [r, k] float32,
    target ids [r, k] int64, log q [r, Vd] float32): reference.py. log q is written into `logprobs_out` ([r, Vd]
    float32, rows contiguous) when one is given (a buffer the tree's verify reads whole: no concatenation)."""
    if use_triton(draft_logits, "sampled_topk"):
        from specdraft.kernels.sampled_topk.triton_kernel import sampled_topk_triton

        return sampled_topk_triton(draft_logits, d2t, k, exponential, temperature, logprobs_out=logprobs_out)
    return sampled_topk_reference(draft_logits, d2t, k, exponential, temperature, logprobs_out)


__all__ = ["sampled_topk", "sampled_topk_reference"]
