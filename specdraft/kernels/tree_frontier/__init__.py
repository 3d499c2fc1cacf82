"""`advance_frontier`: one EAGLE-2 tree expansion step's bookkeeping (joint scores, parents, the next frontier's
top k, its parents' output and mask rows), fused.

Dispatch: the Triton kernel when `use_triton(child_logprobs)`, else the reference
(tests/kernels/test_tree_frontier.py checks that both compute the same function).
"""
from typing import Optional

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.tree_frontier.reference import Frontier, advance_frontier_reference


def advance_frontier(child_logprobs: torch.Tensor, child_tokens: torch.Tensor, frontier_scores: torch.Tensor,
                     frontier_ids: torch.Tensor, base: int, hidden: torch.Tensor, visible: torch.Tensor,
                     own_slot_base: Optional[int] = None) -> Frontier:
    """child_logprobs [k, K] float32, child_tokens [k, K] int64, frontier_scores [k], frontier_ids [k], base,
    hidden [k, H], visible [k, W] bool, own_slot_base (the next frontier's first scratch slot, or None) -> Frontier
    (reference.py)."""
    if use_triton(child_logprobs, "tree_frontier"):
        from specdraft.kernels.tree_frontier.triton_kernel import advance_frontier_triton

        return advance_frontier_triton(child_logprobs, child_tokens, frontier_scores, frontier_ids, base, hidden,
                                       visible, own_slot_base)
    return advance_frontier_reference(child_logprobs, child_tokens, frontier_scores, frontier_ids, base, hidden,
                                      visible, own_slot_base)


__all__ = ["Frontier", "advance_frontier", "advance_frontier_reference"]
