"""Tree attention, flash-decoding style, in two launches.

Stage 1, one program per (key split, row block, kv head): the rows are the (query head of the group, tree node)
pairs that share the kv head, so a kv block is loaded once for the whole group. Each program runs an online
softmax (base 2, float32) over its split's visible slots and writes an unnormalised partial output with its
running max and sum. Splits that start past prefix_len + W (the window) do nothing. Stage 2, one program per
(query head, node): rescales and sums the active splits' partials. The window (the slots after prefix_len a query
may see, through its mask row) is the tree's N nodes in a verify, a draft's scratch slots in a drafting step. A
sliding-window layer's queries also drop the keys before their windows (reference.py): a prefix slot from the
query's position - w + 1 on, a tree column only when its node's position is within w of the query's; key blocks
wholly before every row's window are skipped. The grid depends only on shapes, never on prefix_len, so both
launches can be captured in a CUDA graph."""
import math

import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels import launch, triton_interpreting
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import dot_operand

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, prefix_len_ptr, tree_mask_ptr, positions_ptr, part_out_ptr, part_max_ptr,
                  part_sum_ptr, q_stride_h, q_stride_n, k_stride_h, k_stride_s, v_stride_h, v_stride_s, num_nodes,
                  window, group, seq_len, num_splits, qk_scale_log2, sliding_window, BLOCK_R: tl.constexpr,
                  BLOCK_S: tl.constexpr, SPLIT_BLOCKS: tl.constexpr, BLOCK_T: tl.constexpr,
                  FIRST_COLUMN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, SLIDING: tl.constexpr):
    split, row_block, kv_head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    prefix_len = tl.load(prefix_len_ptr).to(tl.int32)
    split_start = split * (SPLIT_BLOCKS * BLOCK_S)
    split_end = tl.minimum(tl.minimum(split_start + SPLIT_BLOCKS * BLOCK_S, prefix_len + window), seq_len)
    rows = row_block * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R], row = group member * N + node
    is_row = rows < group * num_nodes
    node = rows % num_nodes
    q_head = kv_head * group + rows // num_nodes
    dims = tl.arange(0, BLOCK_D)
    is_dim = dims < HEAD_DIM  # all true, folded away, when HEAD_DIM is a power of two
    q = tl.load(q_ptr + q_head[:, None] * q_stride_h + node[:, None] * q_stride_n + dims[None, :],
                mask=is_row[:, None] & is_dim[None, :], other=0.0)  # [BLOCK_R, BLOCK_D]
    q = dot_operand(q, UPCAST)
    tree_cols = tl.arange(0, BLOCK_T)
    sees = tl.load(tree_mask_ptr + node[:, None] * window + tree_cols[None, :],
                   mask=is_row[:, None] & ((tree_cols < window) & (tree_cols >= FIRST_COLUMN))[None, :],
                   other=0)  # [BLOCK_R, BLOCK_T]
    if SLIDING:  # a sliding-window layer: keys more than w - 1 positions before the query's are hidden
        row_position = tl.load(positions_ptr + node, mask=is_row, other=0).to(tl.int32)  # [BLOCK_R]
        column_position = tl.load(positions_ptr + tree_cols, mask=tree_cols < window, other=0).to(tl.int32)
        sees = tl.where(column_position[None, :] > (row_position - sliding_window)[:, None], sees, 0)
        first_slot = row_position - sliding_window + 1  # [BLOCK_R] its first visible prefix slot
        lowest = tl.min(tl.where(is_row, first_slot, seq_len), 0)  # no row sees a slot before this one
    else:
        first_slot = tl.zeros([BLOCK_R], tl.int32)
        lowest = 0
    ancestor_bits = tl.sum(tl.where(sees != 0, tl.full([1, BLOCK_T], 1, tl.int64) << tree_cols[None, :], 0), 1)
    k_base = k_ptr + kv_head.to(tl.int64) * k_stride_h + dims[None, :]
    v_base = v_ptr + kv_head.to(tl.int64) * v_stride_h + dims[None, :]
    row_max = tl.full([BLOCK_R], -float("inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_R], tl.float32)
    out = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for block in range(SPLIT_BLOCKS):  # a constant trip count: the interpreter cannot loop to a loaded bound
        block_start = split_start + block * BLOCK_S
        if SLIDING:  # blocks wholly before every row's window are skipped
            runs = (block_start < split_end) & (block_start + BLOCK_S > lowest)
        else:
            runs = block_start < split_end
        if runs:
            slots = block_start + tl.arange(0, BLOCK_S)  # [BLOCK_S]
            in_split = slots < split_end
            kv_mask = in_split[:, None] & is_dim[None, :]
            keys = dot_operand(tl.load(k_base + slots[:, None] * k_stride_s, mask=kv_mask, other=0.0), UPCAST)
            scores = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION) * qk_scale_log2  # [BLOCK_R, BLOCK_S]
            tree_index = slots - prefix_len  # [BLOCK_S], the window column of each slot
            in_tree = in_split & (tree_index >= 0)
            bit = tl.minimum(tl.maximum(tree_index, 0), 63).to(tl.int64)
            sees_node = ((ancestor_bits[:, None] >> bit[None, :]) & 1) != 0  # [BLOCK_R, BLOCK_S]
            sees_prefix = (in_split & (slots < prefix_len))[None, :]  # [1, BLOCK_S]
            if SLIDING:
                sees_prefix = sees_prefix & (slots[None, :] >= first_slot[:, None])  # [BLOCK_R, BLOCK_S]
            visible = sees_prefix | (sees_node & in_tree[None, :])
            scores = tl.where(visible, scores, -float("inf"))
            new_max = tl.maximum(row_max, tl.max(scores, 1))
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # rows that have seen nothing yet
            probs = tl.exp2(scores - shift[:, None])
            rescale = tl.exp2(row_max - shift)
            values = dot_operand(tl.load(v_base + slots[:, None] * v_stride_s, mask=kv_mask, other=0.0), UPCAST)
            out = out * rescale[:, None] + tl.dot(probs.to(values.dtype), values, input_precision=DOT_PRECISION)
            row_sum = row_sum * rescale + tl.sum(probs, 1)
            row_max = new_max
    part_rows = (kv_head * group * num_nodes + rows) * num_splits + split  # (q_head * N + node) * splits + split
    is_active = is_row & (split_start < prefix_len + window)
    tl.store(part_max_ptr + part_rows, row_max, mask=is_active)
    tl.store(part_sum_ptr + part_rows, row_sum, mask=is_active)
    tl.store(part_out_ptr + part_rows[:, None] * BLOCK_D + dims[None, :], out, mask=is_active[:, None])


@triton.jit
def _combine_kernel(part_out_ptr, part_max_ptr, part_sum_ptr, prefix_len_ptr, out_ptr, out_stride_h, out_stride_n,
                    num_nodes, window, num_splits, split_size, BLOCK_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    row = tl.program_id(0)  # q_head * N + node
    splits = tl.arange(0, BLOCK_SPLITS)
    is_active = (splits < num_splits) & (splits * split_size < tl.load(prefix_len_ptr).to(tl.int32) + window)
    part_max = tl.load(part_max_ptr + row * num_splits + splits, mask=is_active, other=-float("inf"))
    part_sum = tl.load(part_sum_ptr + row * num_splits + splits, mask=is_active, other=0.0)
    top = tl.max(part_max, 0)
    weights = tl.exp2(part_max - tl.where(top == -float("inf"), 0.0, top))  # [BLOCK_SPLITS]
    dims = tl.arange(0, BLOCK_D)
    part_out = tl.load(part_out_ptr + (row * num_splits + splits)[:, None] * BLOCK_D + dims[None, :],
                       mask=is_active[:, None], other=0.0)  # [BLOCK_SPLITS, BLOCK_D]
    total = tl.sum(part_sum * weights, 0)
    out = tl.sum(part_out * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    q_head, node = row // num_nodes, row % num_nodes
    tl.store(out_ptr + q_head * out_stride_h + node * out_stride_n + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def check_sliding(sliding_window: int | None, positions: torch.Tensor | None, tree_mask: torch.Tensor) -> None:
    """A sliding window comes with the queries' positions, over a square mask (a verify: node j at column j)."""
    if sliding_window is None:
        return
    if sliding_window < 1 or positions is None or positions.shape != tree_mask.shape[:1] \
            or tree_mask.shape[0] != tree_mask.shape[1]:
        raise SpecdraftError(f"tree_attention: a sliding window ({sliding_window}) needs its N queries' positions "
                             f"and a square [N, N] mask; got positions "
                             f"{None if positions is None else tuple(positions.shape)}, mask {tuple(tree_mask.shape)}")


def _launch_shape(group_rows: int, kv_heads: int, seq_len: int, device: torch.device, block_s: int | None,
                  split_size: int | None):
    """(BLOCK_R, BLOCK_S, split_size): row blocks of 16 (the smallest dot) to 64 rows, and splits of keys short
    enough that a full cache spreads over about `target_programs` programs, but no more than 64 splits (the
    combine kernel holds every split's partial output at once)."""
    block_r = min(64, max(16, next_power_of_2(group_rows)))
    block_s = block_s or 64
    programs_per_split = kv_heads * triton.cdiv(group_rows, block_r)
    if split_size is None:
        split_size = next_power_of_2(-(-seq_len * programs_per_split // launch.target_programs(device)))
        split_size = max(split_size, next_power_of_2(-(-seq_len // 64)))
    return block_r, block_s, max(block_s, split_size // block_s * block_s)


def tree_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_len: torch.Tensor,
                          tree_mask: torch.Tensor, scale: float, block_s: int | None = None,
                          split_size: int | None = None, first_column: int = 0, sliding_window: int | None = None,
                          positions: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `tree_attention`; the output is token-major in memory (out.transpose(0, 1) is contiguous,
    so the o projection reads [N, Hq * D] without a copy). `block_s` (a power of two, >= 16) and `split_size` (a
    multiple of it) override the key block and the keys per split (tests use them to force several blocks and
    splits); window columns before `first_column` are never seen; `sliding_window` (with the queries' positions
    [N], a square mask) hides the keys before each query's window."""
    q_heads, num_nodes, head_dim = q.shape
    kv_heads, seq_len, _ = k_cache.shape
    if q_heads % kv_heads or k_cache.shape != v_cache.shape or k_cache.shape[2] != head_dim:
        raise SpecdraftError(f"tree_attention: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)} and v_cache "
                             f"{tuple(v_cache.shape)} must be [Hq, N, D], [Hkv, S, D], [Hkv, S, D], Hq % Hkv == 0")
    if not q.dtype == k_cache.dtype == v_cache.dtype or q.dtype not in _DTYPES:
        raise SpecdraftError(f"tree_attention: q, k_cache, v_cache dtypes {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
                             " must be one of float16, bfloat16, float32, all the same")
    window = tree_mask.shape[1]
    if not 1 <= window <= 64:
        raise SpecdraftError(f"tree_attention: a window of {window} slots; the kernel takes 1 to 64 (one int64 of "
                             "mask bits per query)")
    check_sliding(sliding_window, positions, tree_mask)
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    group = q_heads // kv_heads
    block_r, block_s, split_size = _launch_shape(group * num_nodes, kv_heads, seq_len, q.device, block_s,
                                                 split_size)
    block_d = max(16, next_power_of_2(head_dim))
    num_splits = triton.cdiv(seq_len, split_size)
    upcast = q.dtype == torch.bfloat16 and triton_interpreting()  # the interpreter multiplies bfloat16 bits as ints
    device = q.device
    part_out = torch.empty(q_heads * num_nodes * num_splits, block_d, dtype=torch.float32, device=device)
    part_max = torch.empty(q_heads * num_nodes * num_splits, dtype=torch.float32, device=device)
    part_sum = torch.empty_like(part_max)
    out = torch.empty(num_nodes, q_heads, head_dim, dtype=q.dtype, device=device).transpose(0, 1)  # [Hq, N, D]
    tree_mask = tree_mask.contiguous().view(torch.uint8)
    grid = (num_splits, triton.cdiv(group * num_nodes, block_r), kv_heads)
    sliding = sliding_window is not None
    _split_kernel[grid](q, k_cache, v_cache, prefix_len, tree_mask, positions.contiguous() if sliding else prefix_len,
                        part_out, part_max, part_sum, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
                        v_cache.stride(0), v_cache.stride(1), num_nodes, window, group, seq_len, num_splits,
                        scale * math.log2(math.e), sliding_window if sliding else 0, BLOCK_R=block_r,
                        BLOCK_S=block_s, SPLIT_BLOCKS=split_size // block_s,
                        BLOCK_T=next_power_of_2(window), FIRST_COLUMN=first_column, HEAD_DIM=head_dim, BLOCK_D=block_d,
                        UPCAST=upcast, DOT_PRECISION="ieee" if upcast or q.dtype == torch.float32 else "tf32",
                        SLIDING=sliding, num_warps=8 if block_r * block_d >= 64 * 128 else 4)
    _combine_kernel[(q_heads * num_nodes,)](part_out, part_max, part_sum, prefix_len, out, out.stride(0),
                                            out.stride(1), num_nodes, window, num_splits, split_size,
                                            BLOCK_SPLITS=next_power_of_2(num_splits), HEAD_DIM=head_dim,
                                            BLOCK_D=block_d, num_warps=4)
    return out
