"""`ragged_attention`: attention of N queries over one cache that holds many sequences end to end, each query
over its own sequence's slots (`reference.py`). The batched decoder's attention (decoding/batched.py), in its
decode steps and its packed prefills alike.

Dispatch: the Triton kernels when `use_triton(q)`, else the reference (tests/kernels/test_ragged_attention.py
checks that both compute the same function). A sliding window narrows each query's range to its last w slots
before either runs (`window_range`), so the kernel reads no key outside the window.
"""
from typing import Optional

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.ragged_attention.reference import ragged_attention_reference, visible_range, window_range


def ragged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, starts: torch.Tensor,
                     lengths: torch.Tensor, scale: float, max_length: int,
                     sliding_window: Optional[int] = None) -> torch.Tensor:
    """q [Hq, N, D]; k_cache, v_cache [Hkv, S, D] (Hq % Hkv == 0); starts, lengths [N] int64, 1 <= lengths[i] <=
    max_length (a Python int: the longest sequence the cache holds, which sizes the kernel's launch);
    sliding_window: a sliding-window layer's w (each query sees its sequence's w latest slots, its own
    included) or None -> out [Hq, N, D] in q's dtype (softmax in float32; the Triton kernel's is laid out
    token-major, a transposed view of [N, Hq, D], so the output projection needs no copy)."""
    if sliding_window is not None:
        starts, lengths, max_length = window_range(starts, lengths, sliding_window, max_length)
    if use_triton(q, "ragged_attention"):
        from specdraft.kernels.ragged_attention.triton_kernel import ragged_attention_triton

        return ragged_attention_triton(q, k_cache, v_cache, starts, lengths, scale, max_length)
    return ragged_attention_reference(q, k_cache, v_cache, starts, lengths, scale, max_length)


__all__ = ["ragged_attention", "ragged_attention_reference", "visible_range", "window_range"]
