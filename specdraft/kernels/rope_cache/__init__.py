"""`rope_cache`: rotary embedding of q and k (cos/sin tables gathered by position) fused with writing k and v
into the static KV cache, in one launch.

Dispatch: the Triton kernel when `use_triton(q)`, else the reference (tests/kernels/test_rope_cache.py checks
that both give the same bits).
"""

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.rope_cache.reference import rope_cache_reference, rotate, write_rows


def rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
               positions: torch.Tensor | None, k_cache: torch.Tensor, v_cache: torch.Tensor,
               slots: torch.Tensor, position_offset: int = 0, slot_base: torch.Tensor | None = None) -> torch.Tensor:
    """q [N, Hq, D]; k, v [N, Hkv, D]; cos_table, sin_table [P, D] (half-rotation layout); positions [N] int64 rows
    of the tables (None: row i for token i, P = N); k_cache, v_cache [Hkv, S, D], or [C, Hkv, S, D] to write the
    same keys into C caches; slots [N] int64; position_offset (a Python int) added to every table row; slot_base
    [1] int64 or None, added to every slot (read on the device: a graph replays it as it changes). Writes rotated
    k and v at the slots; returns rotated q [Hq, N, D]."""
    if use_triton(q, "rope_cache"):
        from specdraft.kernels.rope_cache.triton_kernel import rope_cache_triton

        return rope_cache_triton(q, k, v, cos_table, sin_table, positions, k_cache, v_cache, slots, position_offset,
                                 slot_base)
    return rope_cache_reference(q, k, v, cos_table, sin_table, positions, k_cache, v_cache, slots, position_offset,
                                slot_base)


__all__ = ["rope_cache", "rope_cache_reference", "rotate", "write_rows"]
