"""`top_entropy`: the entropy of each row's draft distribution over its M most probable tokens (C2T's parent
entropy, read by a tree scorer at every depth of a drafted tree).

Dispatch: the Triton kernel when `use_triton(logits)`, else the reference (tests/kernels/test_top_entropy.py
checks that both compute the same function).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.top_entropy.reference import top_entropy_reference


def top_entropy(logits: torch.Tensor, top: int) -> torch.Tensor:
    """logits [R, V]; top M >= 1 -> [R] float32 (reference.py)."""
    if use_triton(logits, "top_entropy"):
        from specdraft.kernels.top_entropy.triton_kernel import top_entropy_triton

        return top_entropy_triton(logits, top)
    return top_entropy_reference(logits, top)


__all__ = ["top_entropy", "top_entropy_reference"]
