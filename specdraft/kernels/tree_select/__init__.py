"""`select_tree`: a draft tree's selection after its expansion (the budget best candidates, their parents,
depths and tree-attention mask), fused.

Dispatch: the Triton kernel when `use_triton(cand_scores)`, else the reference
(tests/kernels/test_tree_select.py checks that both compute the same function).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.tree_select.reference import TreeSelection, ancestry, select_tree_reference


def select_tree(cand_tokens: torch.Tensor, cand_parents: torch.Tensor, cand_scores: torch.Tensor, budget: int,
                max_depth: int) -> TreeSelection:
    """cand_tokens [C], cand_parents [C], cand_scores [C] float32, budget N, max_depth -> TreeSelection
    (reference.py)."""
    if use_triton(cand_scores, "tree_select"):
        from specdraft.kernels.tree_select.triton_kernel import select_tree_triton

        return select_tree_triton(cand_tokens, cand_parents, cand_scores, budget, max_depth)
    return select_tree_reference(cand_tokens, cand_parents, cand_scores, budget, max_depth)


__all__ = ["TreeSelection", "ancestry", "select_tree", "select_tree_reference"]
