"""`verify_greedy`: the target's argmax at every tree node fused with the walk down the accepted path.

Dispatch: the Triton kernels when `use_triton(target_logits)`, else the reference
(tests/kernels/test_tree_verify.py checks that both compute the same function).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.tree_verify.reference import verify_greedy_reference


def verify_greedy(target_logits: torch.Tensor, tree_tokens: torch.Tensor, parents: torch.Tensor,
                  depth_limit: int):
    """target_logits [N, V]; tree_tokens, parents [N] int64 (parents[0] = -1, parents[i] < i; -1 also
    marks a node no path reaches) -> (accepted_nodes [depth_limit + 1] int64 padded with -1, accept_length [1]
    int64, bonus_token [1] int64)."""
    if use_triton(target_logits, "tree_verify"):
        from specdraft.kernels.tree_verify.triton_kernel import verify_greedy_triton

        return verify_greedy_triton(target_logits, tree_tokens, parents, depth_limit)
    return verify_greedy_reference(target_logits, tree_tokens, parents, depth_limit)


__all__ = ["verify_greedy", "verify_greedy_reference"]
