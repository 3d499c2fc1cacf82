"""Ragged attention, flash-decoding style. Stage 1, one program per (query, key split, kv head): its rows are the
query heads of the group (one kv block loaded once for all of them); it runs an online softmax (base 2, float32)
over the split's slots of the query's own sequence, starts[q] + [split * split_size, ...), up to lengths[q], and
writes an unnormalised partial output with its running max and sum (or, with a single split, the normalised
output itself). Splits that start past the query's length do nothing. Stage 2 (several splits only), one program
per (query head, query): rescales and sums the active splits' partials. The grid depends only on shapes and on
`max_length`, never on the lengths, so both launches can be captured in a CUDA graph."""
import math

import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels import launch, triton_interpreting
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import dot_operand

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_SPLITS = 64  # the combine kernel holds every split's partial output of a query at once


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, starts_ptr, lengths_ptr, out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
                  q_stride_h, q_stride_n, k_stride_h, k_stride_s, v_stride_h, v_stride_s, out_stride_h,
                  out_stride_n, num_queries, group, num_splits, qk_scale_log2, BLOCK_R: tl.constexpr,
                  BLOCK_S: tl.constexpr, SPLIT_BLOCKS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, DIRECT: tl.constexpr):
    query, split, kv_head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start = tl.load(starts_ptr + query).to(tl.int64)  # the sequence's first slot
    length = tl.load(lengths_ptr + query).to(tl.int32)
    split_start = split * (SPLIT_BLOCKS * BLOCK_S)  # offsets within the sequence
    split_end = tl.minimum(split_start + SPLIT_BLOCKS * BLOCK_S, length)
    rows = tl.arange(0, BLOCK_R)  # [BLOCK_R] members of the head group
    is_row = rows < group
    q_head = kv_head * group + rows
    dims = tl.arange(0, BLOCK_D)
    is_dim = dims < HEAD_DIM  # all true, folded away, when HEAD_DIM is a power of two
    tile_mask = is_row[:, None] & is_dim[None, :]
    q = tl.load(q_ptr + q_head[:, None] * q_stride_h + query * q_stride_n + dims[None, :], mask=tile_mask, other=0.0)
    q = dot_operand(q, UPCAST)  # [BLOCK_R, BLOCK_D]
    k_base = k_ptr + kv_head.to(tl.int64) * k_stride_h + start * k_stride_s + dims[None, :]
    v_base = v_ptr + kv_head.to(tl.int64) * v_stride_h + start * v_stride_s + dims[None, :]
    row_max = tl.full([BLOCK_R], -float("inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_R], tl.float32)
    out = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    # A constant trip count: the interpreter cannot loop to a loaded bound (split sizes are powers of two, so few
    # variants compile).
    for block in range(SPLIT_BLOCKS):
        block_start = split_start + block * BLOCK_S
        if block_start < split_end:
            offsets = block_start + tl.arange(0, BLOCK_S)  # [BLOCK_S]
            in_range = offsets < split_end
            kv_mask = in_range[:, None] & is_dim[None, :]
            slot_offsets = offsets.to(tl.int64)[:, None]
            keys = dot_operand(tl.load(k_base + slot_offsets * k_stride_s, mask=kv_mask, other=0.0), UPCAST)
            scores = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION) * qk_scale_log2  # [BLOCK_R, BLOCK_S]
            scores = tl.where(in_range[None, :], scores, -float("inf"))
            new_max = tl.maximum(row_max, tl.max(scores, 1))  # finite: the block holds a slot in range
            probs = tl.exp2(scores - new_max[:, None])
            rescale = tl.exp2(row_max - new_max)
            values = dot_operand(tl.load(v_base + slot_offsets * v_stride_s, mask=kv_mask, other=0.0), UPCAST)
            out = out * rescale[:, None] + tl.dot(probs.to(values.dtype), values, input_precision=DOT_PRECISION)
            row_sum = row_sum * rescale + tl.sum(probs, 1)
            row_max = new_max
    if DIRECT:  # one split: the whole sequence was seen here (row_sum > 0: every query sees its own slot)
        out_ptrs = out_ptr + q_head[:, None] * out_stride_h + query * out_stride_n + dims[None, :]
        tl.store(out_ptrs, (out / row_sum[:, None]).to(out_ptr.dtype.element_ty), mask=tile_mask)
    else:
        part_rows = (q_head * num_queries + query) * num_splits + split  # (q_head * N + query) * splits + split
        is_active = is_row & (split_start < length)
        tl.store(part_max_ptr + part_rows, row_max, mask=is_active)
        tl.store(part_sum_ptr + part_rows, row_sum, mask=is_active)
        tl.store(part_out_ptr + part_rows[:, None] * BLOCK_D + dims[None, :], out, mask=is_active[:, None])


@triton.jit
def _combine_kernel(part_out_ptr, part_max_ptr, part_sum_ptr, lengths_ptr, out_ptr, out_stride_h, out_stride_n,
                    num_queries, num_splits, split_size, BLOCK_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    row = tl.program_id(0)  # q_head * N + query
    q_head, query = row // num_queries, row % num_queries
    splits = tl.arange(0, BLOCK_SPLITS)
    is_active = (splits < num_splits) & (splits * split_size < tl.load(lengths_ptr + query).to(tl.int32))
    part_max = tl.load(part_max_ptr + row * num_splits + splits, mask=is_active, other=-float("inf"))
    part_sum = tl.load(part_sum_ptr + row * num_splits + splits, mask=is_active, other=0.0)
    weights = tl.exp2(part_max - tl.max(part_max, 0))  # [BLOCK_SPLITS]; split 0 is always active
    dims = tl.arange(0, BLOCK_D)
    part_out = tl.load(part_out_ptr + (row * num_splits + splits)[:, None] * BLOCK_D + dims[None, :],
                       mask=is_active[:, None], other=0.0)  # [BLOCK_SPLITS, BLOCK_D]
    out = tl.sum(part_out * weights[:, None], 0) / tl.sum(part_sum * weights, 0)
    tl.store(out_ptr + q_head * out_stride_h + query * out_stride_n + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def split_size_for(num_queries: int, kv_heads: int, max_length: int, device: torch.device, block_s: int) -> int:
    """Keys per split, a multiple of block_s: about `target_programs` programs for the longest sequences (a few
    queries spread over many splits; a batch of hundreds needs one), at most MAX_SPLITS splits."""
    wanted = next_power_of_2(-(-max_length * num_queries * kv_heads // launch.target_programs(device)))
    size = max(wanted, next_power_of_2(-(-max_length // MAX_SPLITS)), block_s)
    return min(size, next_power_of_2(max_length)) // block_s * block_s or block_s


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if q.shape[0] % k_cache.shape[0] or k_cache.shape != v_cache.shape or k_cache.shape[2] != q.shape[2]:
        raise SpecdraftError(f"ragged_attention: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)} and v_cache "
                             f"{tuple(v_cache.shape)} must be [Hq, N, D], [Hkv, S, D], [Hkv, S, D], Hq % Hkv == 0")
    if not q.dtype == k_cache.dtype == v_cache.dtype or q.dtype not in _DTYPES:
        raise SpecdraftError(f"ragged_attention: q, k_cache, v_cache dtypes {q.dtype}, {k_cache.dtype}, "
                             f"{v_cache.dtype} must be one of float16, bfloat16, float32, all the same")


def ragged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, starts: torch.Tensor,
                            lengths: torch.Tensor, scale: float, max_length: int, block_s: int = 64,
                            split_size: int | None = None) -> torch.Tensor:
    """Same contract as `ragged_attention`; the output is token-major in memory. `block_s` (a power of two, >= 16)
    and `split_size` (a multiple of it) override the key block and the keys per split (tests force several)."""
    _check(q, k_cache, v_cache)
    q_heads, num_queries, head_dim = q.shape
    kv_heads = k_cache.shape[0]
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    split_size = split_size or split_size_for(num_queries, kv_heads, max_length, q.device, block_s)
    num_splits = triton.cdiv(max_length, split_size)
    if num_splits > MAX_SPLITS:
        raise SpecdraftError(f"ragged_attention: {num_splits} splits of {split_size} keys; at most {MAX_SPLITS}")
    group, block_d = q_heads // kv_heads, max(16, next_power_of_2(head_dim))
    out = torch.empty(num_queries, q_heads, head_dim, dtype=q.dtype, device=q.device).transpose(0, 1)  # [Hq, N, D]
    if num_queries == 0:
        return out
    parts = q_heads * num_queries * num_splits if num_splits > 1 else 1
    part_out = torch.empty(parts, block_d, dtype=torch.float32, device=q.device)
    part_max = torch.empty(parts, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    upcast = q.dtype == torch.bfloat16 and triton_interpreting()
    starts, lengths = starts.contiguous(), lengths.contiguous()
    _split_kernel[(num_queries, num_splits, kv_heads)](
        q, k_cache, v_cache, starts, lengths, out, part_out, part_max, part_sum, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
        num_queries, group, num_splits, scale * math.log2(math.e), BLOCK_R=max(16, next_power_of_2(group)),
        BLOCK_S=block_s, SPLIT_BLOCKS=split_size // block_s, HEAD_DIM=head_dim, BLOCK_D=block_d, UPCAST=upcast,
        DOT_PRECISION="ieee" if upcast or q.dtype == torch.float32 else "tf32", DIRECT=num_splits == 1,
        num_warps=4)
    if num_splits > 1:
        _combine_kernel[(q_heads * num_queries,)](
            part_out, part_max, part_sum, lengths, out, out.stride(0), out.stride(1), num_queries, num_splits,
            split_size, BLOCK_SPLITS=next_power_of_2(num_splits), HEAD_DIM=head_dim, BLOCK_D=block_d, num_warps=4)
    return out
