"""`compact_kv`: move accepted tree entries of a static KV cache next to the confirmed prefix, in place."""
import torch

from specdraft.kernels.kv_compact.reference import compact_kv_reference


def compact_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, src_slots: torch.Tensor, dst_start: torch.Tensor,
               count: torch.Tensor) -> None:
    """k/v_cache [L, Hkv, S, D]; src_slots [M] int64; dst_start, count [1] int64."""
    compact_kv_reference(k_cache, v_cache, src_slots, dst_start, count)


__all__ = ["compact_kv", "compact_kv_reference"]
