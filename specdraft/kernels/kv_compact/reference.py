"""KV compaction, the spec: move the accepted nodes' entries to the slots right after the prefix."""
import torch


def compact_kv_reference(k_cache: torch.Tensor, v_cache: torch.Tensor, src_slots: torch.Tensor,
                         dst_start: torch.Tensor, count: torch.Tensor) -> None:
    """k/v_cache [L, Hkv, S, D] in place; src_slots [M]; dst_start, count [1]: for i < count,
    cache[:, :, dst_start + i] = old cache[:, :, src_slots[i]]."""
    m = src_slots.shape[0]
    index = torch.arange(m, device=src_slots.device)
    valid = index < count
    dst = torch.where(valid, dst_start + index, src_slots)  # an invalid entry rewrites its own source
    for cache in (k_cache, v_cache):
        moved = cache.index_select(2, src_slots)  # [L, Hkv, M, D] old values first
        cache.index_copy_(2, dst, moved)
