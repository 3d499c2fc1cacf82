"""`soft_cross_entropy`: sum_n w_n * CE(softmax(target_n), draft_n) over rows of logits.

The target side gets no gradient (a frozen teacher). Dispatch: the chunked version unless
SPECDRAFT_KERNELS=reference; both compute the same function (tests/kernels/test_soft_ce.py).
"""
import torch

from specdraft.kernels import use_reference
from specdraft.kernels.soft_ce.chunked import ChunkedSoftCrossEntropy
from specdraft.kernels.soft_ce.reference import soft_cross_entropy_reference


def soft_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor, row_weights: torch.Tensor,
                       chunk_rows: int = 4096) -> torch.Tensor:
    """draft_logits, target_logits [N, V] (any float dtype); row_weights [N] -> float32 scalar."""
    if use_reference():
        return soft_cross_entropy_reference(draft_logits, target_logits.detach(), row_weights)
    return ChunkedSoftCrossEntropy.apply(draft_logits, target_logits.detach(), row_weights.detach(), chunk_rows)


__all__ = ["soft_cross_entropy", "soft_cross_entropy_reference"]
