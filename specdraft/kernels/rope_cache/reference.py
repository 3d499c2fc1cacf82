"""Rotary embedding of q and k fused with the KV-cache write, the spec (Hugging Face Llama's rounding order).

    cos, sin = cos_table[positions], sin_table[positions]            # [N, D]; row i itself when positions is None
    rotate(x) = x * cos + cat(-x[..., D/2:], x[..., :D/2]) * sin       # half-rotation layout
    k_cache[..., :, slots[i], :] = rotate(k)[:, i]; v_cache[..., :, slots[i], :] = v[i]   # every copy of a 4-d cache
    returns rotate(q) [Hq, N, D]

In half precision each of the two products and the sum is rounded to the dtype, as separate PyTorch ops round them.
"""

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, N, D]; cos, sin [N, D] (half-rotation layout) -> [heads, N, D]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def write_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """cache [Hkv, S, D], or [C, Hkv, S, D] (the same rows into each of C copies); slots [N]; rows [Hkv, N, D]."""
    if cache.dim() == 4:
        cache.index_copy_(2, slots, rows.expand(cache.shape[0], *rows.shape))
    else:
        cache.index_copy_(1, slots, rows)


def rope_cache_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_table: torch.Tensor,
                         sin_table: torch.Tensor, positions: torch.Tensor | None, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """q [N, Hq, D]; k, v [N, Hkv, D]; cos_table, sin_table [P, D]; positions [N] int64 or None (P = N, row i);
    k_cache, v_cache [Hkv, S, D] or [C, Hkv, S, D]; slots [N] int64 -> rotated q [Hq, N, D]."""
    cos, sin = (cos_table, sin_table) if positions is None else (cos_table[positions], sin_table[positions])
    write_rows(k_cache, slots, rotate(k.transpose(0, 1), cos, sin))
    write_rows(v_cache, slots, v.transpose(0, 1))
    return rotate(q.transpose(0, 1), cos, sin)
