"""`compact_kv`: moves the accepted tree nodes' KV entries to consecutive slots, in place, every layer of both
caches in one launch.

Dispatch: the Triton kernel when `use_triton(k_cache)`, else the reference (tests/kernels/test_kv_compact.py
checks that both compute the same function).
"""
import torch

from specdraft.kernels import use_triton
from specdraft.kernels.kv_compact.reference import compact_kv_reference


def compact_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, src_slots: torch.Tensor, dst_start: torch.Tensor,
               count: torch.Tensor) -> None:
    """k_cache, v_cache [L, Hkv, S, D] (same shape and dtype); src_slots [M] int64 increasing; dst_start,
    count [1] int64 (count <= M). In place: cache[:, :, dst_start + i] = old cache[:, :, src_slots[i]], i < count."""
    if use_triton(k_cache, "kv_compact"):
        from specdraft.kernels.kv_compact.triton_kernel import compact_kv_triton

        return compact_kv_triton(k_cache, v_cache, src_slots, dst_start, count)
    return compact_kv_reference(k_cache, v_cache, src_slots, dst_start, count)


__all__ = ["compact_kv", "compact_kv_reference"]
