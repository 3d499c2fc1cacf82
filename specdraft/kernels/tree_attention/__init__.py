"""`tree_attention`: the verify pass's attention of N tree nodes over the cached prefix and their own ancestors
(a sliding-window layer's: within each query's window).

Dispatch: the Triton kernels when `use_triton(q)`, else the reference (tests/kernels/test_tree_attention.py
checks that both compute the same function). On the CPU (eager, never in a graph) the reference gets the slots in
use alone, before prefix_len + W: the kernels skip the rest too, and attending over the whole cache would cost
every CPU step the slots no token holds yet (docs/benchmarks.md, kernels suite). One query that sees the prefix
and itself (plain decoding's step) is one SDPA call over those slots (those of its window), with no mask: the
CPU's fused attention kernel, not the mask, the repeated keys and the masked softmax of the reference.
"""
from typing import Optional

import torch
import torch.nn.functional as F

from specdraft.kernels import use_triton
from specdraft.kernels.tree_attention.reference import in_sliding_window, tree_attention_reference, visible_slots

MAX_WINDOW = 64  # the most slots a query's mask covers in the Triton kernel (one int64 of bits)


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_len: torch.Tensor,
                   tree_mask: torch.Tensor, scale: float, first_column: int = 0, sliding_window: Optional[int] = None,
                   positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [Hq, N, D]; k_cache, v_cache [Hkv, S, D] (Hq % Hkv == 0); prefix_len [1] int64; tree_mask [N, W] bool
    (query i sees slot prefix_len + j; W = N in a verify); window columns before first_column are never seen (a
    drafter's scratch slot 0 when it wrote nothing there); sliding_window: a sliding-window layer's w, with
    positions [N] the queries' (a verify's square mask: node j at column j), or None -> out [Hq, N, D] in q's
    dtype (softmax in float32; the Triton kernel's is laid out token-major, a transposed view of [N, Hq, D], so
    the output projection needs no copy). Windows of more than MAX_WINDOW slots take the reference."""
    if use_triton(q, "tree_attention") and tree_mask.shape[1] <= MAX_WINDOW:
        from specdraft.kernels.tree_attention.triton_kernel import tree_attention_triton

        return tree_attention_triton(q, k_cache, v_cache, prefix_len, tree_mask, scale, first_column=first_column,
                                     sliding_window=sliding_window, positions=positions)
    if q.device.type == "cpu":  # eager (no graph): read only the slots in use, as the kernel does
        used = int(prefix_len) + tree_mask.shape[1]  # slots from here on are never seen
        if tree_mask.shape == (1, 1) and first_column == 0 and bool(tree_mask[0, 0]):
            return _one_query(q, k_cache[:, :used], v_cache[:, :used], scale, sliding_window, positions)
        k_cache, v_cache = k_cache[:, :used], v_cache[:, :used]
    return tree_attention_reference(q, k_cache, v_cache, prefix_len, tree_mask, scale, first_column, sliding_window,
                                    positions)


def _one_query(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
               sliding_window: Optional[int], positions: Optional[torch.Tensor]) -> torch.Tensor:
    """q [Hq, 1, D] over keys, values [Hkv, P + 1, D] (the prefix and its own, the last), every one seen but those
    before its sliding window -> [Hq, 1, D]."""
    if sliding_window is not None:  # the prefix's keys sit at slot = position
        first = min(max(0, int(positions[0]) - sliding_window + 1), keys.shape[1] - 1)
        keys, values = keys[:, first:], values[:, first:]
    return F.scaled_dot_product_attention(q[None], keys[None], values[None], scale=scale,
                                          enable_gqa=q.shape[0] != keys.shape[0])[0]


__all__ = ["MAX_WINDOW", "in_sliding_window", "tree_attention", "tree_attention_reference", "visible_slots"]
