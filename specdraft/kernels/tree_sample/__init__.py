"""`verify_sampled`: recursive rejection sampling over a draft tree (T > 0): every node's test, the accepted path and
the bonus token, in three launches from the target's logits.

Dispatch: the Triton kernels when `use_triton(target_logits)`, else the reference (tests/kernels/
test_tree_sample.py checks that both compute the same function: the same path, and the bonus's distribution).
"""
from typing import Optional

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.tree_sample.reference import verify_sampled_reference


def verify_sampled(target_logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                   uniforms: torch.Tensor, depth_limit: int, temperature: float, rows: Optional[torch.Tensor] = None,
                   logprobs: Optional[torch.Tensor] = None, d2t: Optional[torch.Tensor] = None,
                   sampled: Optional[torch.Tensor] = None):
    """The contract of `verify_sampled_reference` (reference.py): -> (accepted_nodes [depth_limit + 1] int64 (-1
    padded), accept_length [1] int64, bonus [1] int64). Static shapes, no host sync."""
    if use_triton(target_logits, "tree_sample"):
        from specdraft.kernels.tree_sample.triton_kernel import verify_sampled_triton

        return verify_sampled_triton(target_logits, tokens, parents, uniforms, depth_limit, temperature, rows,
                                     logprobs, d2t, sampled)
    return verify_sampled_reference(target_logits, tokens, parents, depths, uniforms, depth_limit, temperature,
                                    rows, logprobs, d2t, sampled)


__all__ = ["verify_sampled", "verify_sampled_reference"]
