"""KV-cache compaction, the spec: cache[:, :, dst_start + i] = old cache[:, :, src_slots[i]] for i < count, in
place, in both caches. Every row is gathered before any is written, so a destination may be another entry's
source."""
import torch


def _compact_one(cache: torch.Tensor, src_slots: torch.Tensor, dst_start: torch.Tensor, count: torch.Tensor):
    """cache [L, Hkv, S, D]; src_slots [M] int64; dst_start, count [1] int64."""
    entries = torch.arange(src_slots.shape[0], device=src_slots.device)  # [M]
    entries = torch.minimum(entries, (count - 1).clamp(min=0))  # entries past `count` repeat the last valid one
    src = src_slots[entries]  # [M]
    dst = torch.where(count > 0, dst_start + entries, src)  # count == 0: each slot is copied onto itself
    rows = cache.index_select(2, src)  # [L, Hkv, M, D], gathered before any write
    cache.index_copy_(2, dst, rows)  # repeated (dst, row) pairs write the same values


def compact_kv_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, src_slots: torch.Tensor,
                         dst_start: torch.Tensor, count: torch.Tensor) -> None:
    """k_cache, v_cache [L, Hkv, S, D]; src_slots [M] int64 increasing; dst_start, count [1] int64 (count <= M)."""
    for cache in (k_cache, v_cache):
        _compact_one(cache, src_slots, dst_start, count)
