"""`ragged_attention`: attention of N queries over one cache that holds many sequences end to end, each query
over its own sequence's slots (`reference.py`). The batched decoder's attention (decoding/batched.py), in its
decode steps and its packed prefills alike.

Dispatch: the Triton kernels when `use_triton(q)`, else the reference (tests/kernels/test_ragged_attention.py
checks that both compute the same function).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.ragged_attention.reference import ragged_attention_reference, visible_range


def ragged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, starts: torch.Tensor,
                     lengths: torch.Tensor, scale: float, max_length: int) -> torch.Tensor:
    """q [Hq, N, D]; k_cache, v_cache [Hkv, S, D] (Hq % Hkv == 0); starts, lengths [N] int64, 1 <= lengths[i] <=
    max_length (a Python int: the longest sequence the cache holds, which sizes the kernel's launch) -> out
    [Hq, N, D] in q's dtype (softmax in float32; the Triton kernel's is laid out token-major, a transposed view
    of [N, Hq, D], so the output projection needs no copy)."""
    if use_triton(q, "ragged_attention"):
        from specdraft.kernels.ragged_attention.triton_kernel import ragged_attention_triton

        return ragged_attention_triton(q, k_cache, v_cache, starts, lengths, scale, max_length)
    return ragged_attention_reference(q, k_cache, v_cache, starts, lengths, scale, max_length)


__all__ = ["ragged_attention", "ragged_attention_reference", "visible_range"]
