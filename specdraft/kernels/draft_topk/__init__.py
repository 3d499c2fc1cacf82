"""`draft_topk`: log-softmax over the draft vocabulary, its top k, and the d2t map to target ids, fused.

Dispatch: the Triton kernel when `use_triton(draft_logits)`, else the reference (tests/kernels/test_draft_topk.py
checks that both compute the same function).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.draft_topk.reference import draft_topk_reference


def draft_topk(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int):
    """draft_logits [N, Vd] (fp32/bf16/fp16); d2t [Vd] int64; k <= Vd ->
    (topk_logprobs [N, k] float32 in descending order, topk_target_ids [N, k] int64)."""
    if use_triton(draft_logits, "draft_topk"):
        from specdraft.kernels.draft_topk.triton_kernel import draft_topk_triton

        return draft_topk_triton(draft_logits, d2t, k)
    return draft_topk_reference(draft_logits, d2t, k)


__all__ = ["draft_topk", "draft_topk_reference"]
