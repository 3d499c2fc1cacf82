"""Rotary embedding of q and k and the KV-cache write in one launch: one program per token loads its cos/sin row
(by its position, plus an offset), rotates every q head and every k head as [heads, D] tiles (D padded to a power
of two and masked; the rotation partner of dim d is d +- D/2, loaded directly), writes q to the output, and the
rotated k and the plain v to the cache slot of the token (plus a base read from a device scalar; into every copy
of a 4-d cache).

Rounding order, as the reference's separate ops: t1 = round(x * cos), t2 = round((-/+ partner) * sin),
out = round(t1 + t2), `round` to the storage dtype (to nearest, ties to even; a no-op in float32). A product of
two half-precision values is exact in float32, so computing it there and rounding once is PyTorch's
half-precision multiply. Floating-point contraction into FMAs is disabled at launch, so float32 matches too."""

import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import round_as


@triton.jit
def _rotate(x_ptrs, partner_ptrs, mask, cos, sin, sign, DTYPE: tl.constexpr):
    """[BLOCK_H, BLOCK_D] tile of heads -> its rotation in float32 (exact in DTYPE)."""
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    partner = tl.load(partner_ptrs, mask=mask, other=0.0).to(tl.float32)
    return round_as(round_as(x * cos, DTYPE) + round_as(sign * partner * sin, DTYPE), DTYPE)


@triton.jit
def _rope_cache_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, positions_ptr, k_cache_ptr, v_cache_ptr, slots_ptr,
                       slot_base_ptr, q_out_ptr, num_tokens, position_offset, positions_stride, slots_stride,
                       q_stride_n, q_stride_h, k_stride_n, k_stride_h, v_stride_n, v_stride_h, cos_stride,
                       sin_stride, kc_stride_c, kc_stride_h, kc_stride_s, vc_stride_c, vc_stride_h, vc_stride_s,
                       Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, COPIES: tl.constexpr, HEAD_DIM: tl.constexpr,
                       HAS_POSITIONS: tl.constexpr, HAS_SLOT_BASE: tl.constexpr, BLOCK_HQ: tl.constexpr,
                       BLOCK_HKV: tl.constexpr, BLOCK_D: tl.constexpr):
    dtype = q_out_ptr.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    in_dim = dims < HEAD_DIM
    first_half = dims < HEAD_DIM // 2
    partner = tl.where(first_half, dims + HEAD_DIM // 2, dims - HEAD_DIM // 2)
    sign = tl.where(first_half, -1.0, 1.0)[None, :]  # [1, BLOCK_D]
    position = (tl.load(positions_ptr + token * positions_stride) if HAS_POSITIONS else token) + position_offset
    cos = tl.load(cos_ptr + position * cos_stride + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + position * sin_stride + dims, mask=in_dim, other=0.0).to(tl.float32)[None, :]

    q_heads = tl.arange(0, BLOCK_HQ)[:, None]  # [BLOCK_HQ, 1]
    q_mask = (q_heads < Q_HEADS) & in_dim[None, :]
    q_rows = q_ptr + token * q_stride_n + q_heads * q_stride_h
    q_rot = _rotate(q_rows + dims[None, :], q_rows + partner[None, :], q_mask, cos, sin, sign, dtype)
    tl.store(q_out_ptr + (q_heads * num_tokens + token) * HEAD_DIM + dims[None, :], q_rot.to(dtype), mask=q_mask)

    kv_heads = tl.arange(0, BLOCK_HKV)[:, None]  # [BLOCK_HKV, 1]
    kv_mask = (kv_heads < KV_HEADS) & in_dim[None, :]
    k_rows = k_ptr + token * k_stride_n + kv_heads * k_stride_h
    k_rot = _rotate(k_rows + dims[None, :], k_rows + partner[None, :], kv_mask, cos, sin, sign, dtype).to(dtype)
    v_rows = tl.load(v_ptr + token * v_stride_n + kv_heads * v_stride_h + dims[None, :], mask=kv_mask)
    slot = tl.load(slots_ptr + token * slots_stride)
    if HAS_SLOT_BASE:
        slot += tl.load(slot_base_ptr)
    for copy in tl.static_range(COPIES):
        k_dst = k_cache_ptr + copy * kc_stride_c + kv_heads * kc_stride_h + slot * kc_stride_s + dims[None, :]
        v_dst = v_cache_ptr + copy * vc_stride_c + kv_heads * vc_stride_h + slot * vc_stride_s + dims[None, :]
        tl.store(k_dst, k_rot, mask=kv_mask)
        tl.store(v_dst, v_rows, mask=kv_mask)


def _cache_strides(cache: torch.Tensor):
    """(copies, copy stride, head stride, slot stride) of a [Hkv, S, D] or [C, Hkv, S, D] cache."""
    if cache.dim() == 4:
        return cache.shape[0], *cache.stride()[:3]
    return 1, 0, *cache.stride()[:2]


def _check(q, k, v, cos_table, sin_table, k_cache, v_cache) -> None:
    tensors = {"q": q, "k": k, "v": v, "cos_table": cos_table, "sin_table": sin_table, "k_cache": k_cache,
               "v_cache": v_cache}
    if len({t.dtype for t in tensors.values()}) != 1 or q.dtype not in (torch.float32, torch.bfloat16,
                                                                         torch.float16):
        raise SpecdraftError("rope_cache: q, k, v, the rope tables and the caches must share one float dtype, got "
                             + ", ".join(f"{name} {t.dtype}" for name, t in tensors.items()))
    if any(t.stride(-1) != 1 for t in tensors.values()):
        raise SpecdraftError("rope_cache: every tensor's last (head) dimension must be contiguous")
    head_dim = q.shape[-1]
    if head_dim % 2 or k.shape != v.shape or k.shape[-1] != head_dim or k_cache.shape != v_cache.shape \
            or k_cache.shape[-3] != k.shape[1] or k_cache.shape[-1] != head_dim or cos_table.shape[-1] != head_dim:
        raise SpecdraftError(f"rope_cache: shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                             f"{tuple(v.shape)}, cache {tuple(k_cache.shape)}, cos_table {tuple(cos_table.shape)}")


def rope_cache_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_table: torch.Tensor,
                      sin_table: torch.Tensor, positions: torch.Tensor | None, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slots: torch.Tensor, position_offset: int = 0,
                      slot_base: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `rope_cache` (any strides but a contiguous last dim; positions and slots any stride)."""
    _check(q, k, v, cos_table, sin_table, k_cache, v_cache)
    num_tokens, q_heads, head_dim = q.shape
    q_out = torch.empty(q_heads, num_tokens, head_dim, device=q.device, dtype=q.dtype)  # [Hq, N, D]
    if num_tokens == 0:
        return q_out
    copies, *k_strides = _cache_strides(k_cache)
    _, *v_strides = _cache_strides(v_cache)
    positions_stride = positions.stride(0) if positions is not None else 0
    _rope_cache_kernel[(num_tokens,)](
        q, k, v, cos_table, sin_table, positions if positions is not None else slots, k_cache, v_cache, slots,
        slot_base if slot_base is not None else slots, q_out, num_tokens, position_offset, positions_stride,
        slots.stride(0), *q.stride()[:2], *k.stride()[:2], *v.stride()[:2],
        cos_table.stride(0), sin_table.stride(0), *k_strides, *v_strides, Q_HEADS=q_heads, KV_HEADS=k.shape[1],
        COPIES=copies, HEAD_DIM=head_dim, HAS_POSITIONS=positions is not None,
        HAS_SLOT_BASE=slot_base is not None, BLOCK_HQ=next_power_of_2(q_heads),
        BLOCK_HKV=next_power_of_2(k.shape[1]), BLOCK_D=next_power_of_2(head_dim), num_warps=4,
        enable_fp_fusion=False)
    return q_out
