"""`draft_topk`: top-k of the draft's log-softmax, fused with the draft-to-target id mapping."""
import torch

from specdraft.kernels.draft_topk.reference import draft_topk_reference


def draft_topk(draft_logits: torch.Tensor, d2t: torch.Tensor, k: int):
    """draft_logits [N, Vd]; d2t [Vd] int64 -> (topk_logprobs [N, k] float32, topk_target_ids [N, k] int64)."""
    return draft_topk_reference(draft_logits, d2t, k)


__all__ = ["draft_topk", "draft_topk_reference"]
