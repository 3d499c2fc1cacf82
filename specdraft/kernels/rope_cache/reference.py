"""Rotary embedding of q and k fused with the KV-cache write, the spec (Hugging Face Llama's rounding order).

    rows = positions + position_offset                                # [N]; i + position_offset when positions is None
    cos, sin = cos_table[rows], sin_table[rows]                        # [N, D]
    slots = slots + slot_base                                          # when a slot_base [1] is given
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
                         v_cache: torch.Tensor, slots: torch.Tensor, position_offset: int = 0,
                         slot_base: torch.Tensor | None = None) -> torch.Tensor:
    """q [N, Hq, D]; k, v [N, Hkv, D]; cos_table, sin_table [P, D]; positions [N] int64 or None (row i);
    k_cache, v_cache [Hkv, S, D] or [C, Hkv, S, D]; slots [N] int64; position_offset added to every table row;
    slot_base [1] int64 (or None) added to every slot -> rotated q [Hq, N, D]."""
    if positions is None and position_offset == 0 and cos_table.shape[0] == q.shape[0]:
        cos, sin = cos_table, sin_table
    else:
        rows = torch.arange(q.shape[0], device=q.device) if positions is None else positions  # [N]
        rows = rows + position_offset if position_offset else rows
        cos, sin = cos_table[rows], sin_table[rows]  # [N, D]
    slots = slots if slot_base is None else slots + slot_base  # [N]
    write_rows(k_cache, slots, rotate(k.transpose(0, 1), cos, sin))
    write_rows(v_cache, slots, v.transpose(0, 1))
    return rotate(q.transpose(0, 1), cos, sin)
