"""`prune_children`: a tree scorer's pruning after a depth's expansion (C2T's two-layer FFN over a child's joint
probability, its parent's top-M entropy and its depth), fused.

Dispatch: the Triton kernel when `use_triton(parent_logits)`, else the reference
(tests/kernels/test_prune_children.py checks that both compute the same function).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.prune_children.reference import (EXTENDED_FEATURES, PAPER_FEATURES, ScorerWeights,
                                                        child_inputs, ffn_features, ffn_logits,
                                                        prune_children_reference)


def prune_children(child_logprobs: torch.Tensor, parent_scores: torch.Tensor, parent_logits: torch.Tensor,
                   depth: int, weights: ScorerWeights, top: int) -> torch.Tensor:
    """child_logprobs [p, k], parent_scores [p], parent_logits [p, V], depth, weights, top -> [p, k] float32
    (reference.py)."""
    if use_triton(parent_logits, "prune_children"):
        from specdraft.kernels.prune_children.triton_kernel import prune_children_triton

        return prune_children_triton(child_logprobs, parent_scores, parent_logits, depth, weights, top)
    return prune_children_reference(child_logprobs, parent_scores, parent_logits, depth, weights, top)


__all__ = ["EXTENDED_FEATURES", "PAPER_FEATURES", "ScorerWeights", "child_inputs", "ffn_features", "ffn_logits",
           "prune_children", "prune_children_reference"]
