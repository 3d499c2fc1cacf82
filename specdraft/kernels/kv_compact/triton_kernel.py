"""KV-cache compaction in one launch: one program per (layer, kv head, head-dim block) owns its rows of both
caches, loads all the accepted entries, waits at a barrier for every warp's loads, then stores them. No other
program touches those addresses, so no write can clobber a row before it is read."""
import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2


@triton.jit
def _compact_kernel(k_ptr, v_ptr, src_slots_ptr, dst_start_ptr, count_ptr, num_entries, num_heads, seq_len,
                    k_stride_l, k_stride_h, k_stride_s, v_stride_l, v_stride_h, v_stride_s,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    layer_head, dim_block = tl.program_id(0), tl.program_id(1)
    layer, head = (layer_head // num_heads).to(tl.int64), layer_head % num_heads
    entries = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    dims = dim_block * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    valid = (entries < num_entries) & (entries < tl.load(count_ptr))
    src = tl.load(src_slots_ptr + entries, mask=valid, other=0)  # [BLOCK_M]
    dst = tl.load(dst_start_ptr) + entries
    rows_mask = valid[:, None] & (dims < HEAD_DIM)[None, :]  # [BLOCK_M, BLOCK_D]
    k_base = k_ptr + layer * k_stride_l + head * k_stride_h + dims[None, :]
    v_base = v_ptr + layer * v_stride_l + head * v_stride_h + dims[None, :]
    k_rows = tl.load(k_base + src[:, None] * k_stride_s, mask=rows_mask)
    v_rows = tl.load(v_base + src[:, None] * v_stride_s, mask=rows_mask)
    tl.debug_barrier()  # every warp's reads of the old rows happen before any warp's writes
    moves = rows_mask & ((src != dst) & (dst < seq_len))[:, None]
    tl.store(k_base + dst[:, None] * k_stride_s, k_rows, mask=moves)
    tl.store(v_base + dst[:, None] * v_stride_s, v_rows, mask=moves)


def compact_kv_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, src_slots: torch.Tensor,
                      dst_start: torch.Tensor, count: torch.Tensor) -> None:
    """Same contract as `compact_kv` (caches with a contiguous last dim; any other strides)."""
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise SpecdraftError(f"compact_kv: k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache "
                             f"{tuple(v_cache.shape)} {v_cache.dtype} must have the same shape and dtype")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise SpecdraftError("compact_kv: the caches' last (head) dimension must be contiguous")
    layers, heads, seq_len, head_dim = k_cache.shape
    num_entries = src_slots.shape[0]
    if num_entries == 0 or k_cache.numel() == 0:
        return
    block_m = next_power_of_2(num_entries)
    block_d = min(next_power_of_2(head_dim), max(16, 8192 // block_m))
    grid = (layers * heads, triton.cdiv(head_dim, block_d))
    _compact_kernel[grid](k_cache, v_cache, src_slots.contiguous(), dst_start, count, num_entries, heads, seq_len,
                          *k_cache.stride()[:3], *v_cache.stride()[:3], HEAD_DIM=head_dim, BLOCK_M=block_m,
                          BLOCK_D=block_d, num_warps=4)
