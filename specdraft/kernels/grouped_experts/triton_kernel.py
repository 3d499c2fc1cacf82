"""The routed experts of a mixture-of-experts layer in four launches, each expert's weights streamed once per block of
up to BLOCK_M of its rows, experts no row routes to never read.

1. route (one program): the N * k (row, expert) pairs sorted by expert (stable: by pair index within an expert), in
   two passes over the pairs (per-expert counts, then each pair's position: its expert's offset plus its rank
   among the expert's earlier pairs), and a table of row blocks: block b holds up to BLOCK_M consecutive sorted
   pairs of one expert (its expert, first sorted position, row count; 0 rows past the last block). The table has
   a static length, an upper bound of the blocks any routing needs (`max_blocks`), so nothing depends on the
   routing's values on the host.
2. gate/up, programs over (block, BLOCK_N columns of I): the block's rows gathered from `hidden`, the expert's gate
   and up rows streamed along H into two float32 accumulators by tl.dot, silu(gate) * up rounded once to the
   dtype, stored at the pairs' sorted positions [P, I]. A block with no rows returns at once.
3. down, programs over (block, BLOCK_N columns of H): the block's activations against the expert's down rows,
   times the pair's routing weight, stored in float32 at the pair's own index [P, H].
4. sum, programs over (row, columns): a row's k pair outputs added in float32 in the order j = 0..k-1 (no atomics:
   the same bits every run) and rounded once to the dtype; ids outside [0, E) add nothing.
A row's result depends on its own inputs alone (the other rows only share its tiles), for a given launch config.
Rounding: to nearest even (`round_as`), the same on a GPU and under the interpreter; bfloat16 dot operands are
upcast to float32 under the interpreter, which would multiply their bits as integers (`dot_operand`).
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels import triton_interpreting
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import dot_operand, round_as

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROUTE_TILE = 8192
"""Elements of one route program's [pairs, experts] comparison tile: it sets how many pairs each step takes."""


class LaunchConfig(NamedTuple):
    """How a call is cut into programs (`launch_config`); tests and the bench force fields."""

    block_m: int  # rows a block (>= 16: tl.dot's smallest tile)
    gate_up_n: int  # columns of I a gate/up program computes (of the gate and of the up half each)
    down_n: int  # columns of H a down program computes
    block_k: int  # the inner dimension's step (H for gate/up, I for down)
    warps: int
    stages: int


def launch_config(pairs: int, num_experts: int, dtype: torch.dtype) -> LaunchConfig:
    """Blocks of 16 rows while an expert gets few pairs on average (a decode step, a tree's verify: the weights are
    the cost, and a bigger block only pads), up to 64 for a prefill's hundreds a expert (fewer re-reads of each
    expert's weights). The inner step depends on the dtype alone, so a row's sums add in the same order at every N."""
    average = pairs // max(1, min(num_experts, pairs))
    block_m = min(64, max(16, next_power_of_2(average)))
    block_k = 64 if dtype == torch.float32 else 128
    return LaunchConfig(block_m=block_m, gate_up_n=32, down_n=64, block_k=block_k, warps=4, stages=4)


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """The most row blocks a routing of `pairs` pairs over `num_experts` experts can need: sum_e ceil(c_e / BM) with
    sum_e c_e = P over at most min(E, P) experts is at most (P + min(E, P) (BM - 1)) / BM, and never more than P."""
    touched = min(num_experts, pairs)
    return min(pairs, (pairs + touched * (block_m - 1)) // block_m)


@triton.jit
def _expert_hits(ids_ptr, chunk, num_pairs, num_experts, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr):
    """[BLOCK_P, BLOCK_E] int32: 1 where pair chunk * BLOCK_P + p routes to expert e (ids outside [0, E) hit
    nothing), and the pairs' indices [BLOCK_P]."""
    pairs = chunk * BLOCK_P + tl.arange(0, BLOCK_P)
    ids = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1)
    experts = tl.arange(0, BLOCK_E)
    hits = (ids[:, None] == experts[None, :]) & (experts < num_experts)[None, :]
    return hits.to(tl.int32), pairs


@triton.jit
def _route_kernel(ids_ptr, sorted_pairs_ptr, block_expert_ptr, block_start_ptr, block_rows_ptr, num_pairs,
                  num_experts, num_blocks, PAIR_STEPS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_STEPS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_M: tl.constexpr):
    counts = tl.zeros([BLOCK_E], tl.int32)
    for chunk in range(PAIR_STEPS):  # constant trip counts: the interpreter cannot loop to a loaded bound
        hits, _ = _expert_hits(ids_ptr, chunk, num_pairs, num_experts, BLOCK_P, BLOCK_E)
        counts += tl.sum(hits, 0)
    ends = tl.cumsum(counts, 0)  # [BLOCK_E] each expert's end in the sorted pairs
    starts = ends - counts
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_ends = tl.cumsum(blocks, 0)
    block_starts = block_ends - blocks
    next_free = starts  # each expert's next sorted position
    for chunk in range(PAIR_STEPS):
        hits, pairs = _expert_hits(ids_ptr, chunk, num_pairs, num_experts, BLOCK_P, BLOCK_E)
        rank = tl.cumsum(hits, 0) - hits  # [BLOCK_P, BLOCK_E] earlier pairs of the chunk to the same expert
        position = tl.sum(hits * (next_free[None, :] + rank), 1)  # [BLOCK_P] (one hit a routed pair)
        tl.store(sorted_pairs_ptr + position, pairs, mask=tl.sum(hits, 1) > 0)
        next_free += tl.sum(hits, 0)
    experts = tl.arange(0, BLOCK_E)
    for chunk in range(BLOCK_STEPS):
        block = chunk * BLOCK_B + tl.arange(0, BLOCK_B)  # [BLOCK_B]
        owns = (block_starts[None, :] <= block[:, None]) & (block[:, None] < block_ends[None, :])  # [BB, BE]
        expert = tl.sum(tl.where(owns, experts[None, :], 0), 1)
        first = tl.sum(tl.where(owns, starts[None, :] + (block[:, None] - block_starts[None, :]) * BLOCK_M, 0), 1)
        last = tl.sum(tl.where(owns, ends[None, :], 0), 1)  # 0 = first past the last block: no rows
        in_table = block < num_blocks
        tl.store(block_expert_ptr + block, expert, mask=in_table)
        tl.store(block_start_ptr + block, first, mask=in_table)
        tl.store(block_rows_ptr + block, tl.minimum(last - first, BLOCK_M), mask=in_table)


@triton.jit
def _block_rows(sorted_pairs_ptr, block_start_ptr, block, rows, BLOCK_M: tl.constexpr):
    """A block's sorted positions [BLOCK_M], which are its rows, and their pairs' indices."""
    positions = tl.load(block_start_ptr + block) + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + positions, mask=tl.arange(0, BLOCK_M) < rows, other=0)
    return positions, pairs


@triton.jit
def _tile_masks(in_m, in_n, k, inner, EVEN_K: tl.constexpr):
    """The masks of a step's row tile [BM, BK] and weight tile [BN, BK]: rows and columns alone where the inner
    dimension divides into steps (the weights then load in full vectors)."""
    if EVEN_K:
        return in_m[:, None], in_n[:, None]
    else:
        in_k = k < inner
        return in_m[:, None] & in_k[None, :], in_n[:, None] & in_k[None, :]


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, act_ptr, sorted_pairs_ptr, block_expert_ptr, block_start_ptr, block_rows_ptr,
                    hidden_size, inter_size, x_stride, w_stride_e, w_stride_r, TOP_K: tl.constexpr,
                    K_STEPS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    block = tl.program_id(0)
    rows = tl.load(block_rows_ptr + block)
    if rows == 0:  # past the routing's blocks
        return
    dtype = act_ptr.dtype.element_ty
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    positions, pairs = _block_rows(sorted_pairs_ptr, block_start_ptr, block, rows, BLOCK_M)
    in_m = tl.arange(0, BLOCK_M) < rows
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] of I
    in_n = cols < inter_size
    x_rows = x_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * x_stride  # [BM, 1]
    gate_rows = w_ptr + expert * w_stride_e + cols.to(tl.int64)[:, None] * w_stride_r  # [BN, 1]
    up_rows = gate_rows + inter_size * w_stride_r
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(K_STEPS):
        k = step * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK] of H
        x_mask, w_mask = _tile_masks(in_m, in_n, k, hidden_size, EVEN_K)
        x = dot_operand(tl.load(x_rows + k[None, :], mask=x_mask, other=0.0), UPCAST)
        w_gate = dot_operand(tl.load(gate_rows + k[None, :], mask=w_mask, other=0.0), UPCAST)  # [BN, BK]
        w_up = dot_operand(tl.load(up_rows + k[None, :], mask=w_mask, other=0.0), UPCAST)
        gate = tl.dot(x, tl.trans(w_gate), gate, input_precision=DOT_PRECISION)
        up = tl.dot(x, tl.trans(w_up), up, input_precision=DOT_PRECISION)
    act = gate / (1.0 + tl.exp(-gate)) * up  # [BM, BN] float32
    tl.store(act_ptr + positions.to(tl.int64)[:, None] * inter_size + cols[None, :],
             round_as(act, dtype).to(dtype), mask=in_m[:, None] & in_n[None, :])


@triton.jit
def _down_kernel(act_ptr, w_ptr, weights_ptr, part_ptr, sorted_pairs_ptr, block_expert_ptr, block_start_ptr,
                 block_rows_ptr, hidden_size, inter_size, w_stride_e, w_stride_r, K_STEPS: tl.constexpr,
                 EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    block = tl.program_id(0)
    rows = tl.load(block_rows_ptr + block)
    if rows == 0:
        return
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    positions, pairs = _block_rows(sorted_pairs_ptr, block_start_ptr, block, rows, BLOCK_M)
    in_m = tl.arange(0, BLOCK_M) < rows
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] of H
    in_n = cols < hidden_size
    act_rows = act_ptr + positions.to(tl.int64)[:, None] * inter_size  # [BM, 1]
    w_rows = w_ptr + expert * w_stride_e + cols.to(tl.int64)[:, None] * w_stride_r  # [BN, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(K_STEPS):
        k = step * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK] of I
        act_mask, w_mask = _tile_masks(in_m, in_n, k, inter_size, EVEN_K)
        act = dot_operand(tl.load(act_rows + k[None, :], mask=act_mask, other=0.0), UPCAST)
        w = dot_operand(tl.load(w_rows + k[None, :], mask=w_mask, other=0.0), UPCAST)
        acc = tl.dot(act, tl.trans(w), acc, input_precision=DOT_PRECISION)
    routing_weight = tl.load(weights_ptr + pairs, mask=in_m, other=0.0).to(tl.float32)  # [BM]
    tl.store(part_ptr + pairs.to(tl.int64)[:, None] * hidden_size + cols[None, :], acc * routing_weight[:, None],
             mask=in_m[:, None] & in_n[None, :])


@triton.jit
def _sum_kernel(part_ptr, ids_ptr, out_ptr, hidden_size, num_experts, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_cols = cols < hidden_size
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(TOP_K):  # in order: the same sum every run
        expert = tl.load(ids_ptr + row * TOP_K + j)
        routed = (expert >= 0) & (expert < num_experts)  # else no program wrote this pair's row
        total += tl.load(part_ptr + (row * TOP_K + j) * hidden_size + cols, mask=in_cols & routed, other=0.0)
    tl.store(out_ptr + row * hidden_size + cols, round_as(total, dtype).to(dtype), mask=in_cols)


def _check(hidden, gate_up, down, expert_ids, expert_weights) -> None:
    rows, hidden_size = hidden.shape
    num_experts, two_inter, _ = gate_up.shape
    if gate_up.shape[2] != hidden_size or two_inter % 2 or down.shape != (num_experts, hidden_size, two_inter // 2):
        raise SpecdraftError(f"grouped_experts: hidden {tuple(hidden.shape)}, gate_up {tuple(gate_up.shape)} and down "
                             f"{tuple(down.shape)} must be [N, H], [E, 2I, H] and [E, H, I]")
    if not hidden.dtype == gate_up.dtype == down.dtype or hidden.dtype not in _DTYPES:
        raise SpecdraftError(f"grouped_experts: hidden, gate_up, down dtypes {hidden.dtype}, {gate_up.dtype}, "
                             f"{down.dtype} must be one of float32, bfloat16, float16, all the same")
    if expert_ids.dim() != 2 or expert_ids.shape[0] != rows or expert_weights.shape != expert_ids.shape \
            or expert_ids.dtype not in (torch.int32, torch.int64):
        raise SpecdraftError(f"grouped_experts: expert_ids {tuple(expert_ids.shape)} {expert_ids.dtype} and "
                             f"expert_weights {tuple(expert_weights.shape)} must be [{rows}, k], the ids int32 or "
                             "int64")


def route_pairs(expert_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The route launch: expert_ids [N, k] (contiguous) -> (sorted_pairs [P] int32: the pairs n * k + j sorted by
    expert, stably, routed pairs first; block_table [3, max_blocks] int32: each block's expert, first sorted
    position and row count, 0 rows past the routing's last block). Sorted positions past the routed pairs are
    left unwritten."""
    pairs = expert_ids.numel()
    num_blocks = max_blocks(pairs, num_experts, block_m)
    sorted_pairs = torch.empty(pairs, device=expert_ids.device, dtype=torch.int32)
    block_table = torch.empty(3, num_blocks, device=expert_ids.device, dtype=torch.int32)
    block_e = max(16, next_power_of_2(num_experts))
    block_p = max(16, min(next_power_of_2(pairs), ROUTE_TILE // block_e))
    _route_kernel[(1,)](expert_ids, sorted_pairs, *block_table, pairs, num_experts, num_blocks,
                        PAIR_STEPS=triton.cdiv(pairs, block_p), BLOCK_P=block_p, BLOCK_E=block_e,
                        BLOCK_STEPS=triton.cdiv(num_blocks, 64), BLOCK_B=64, BLOCK_M=block_m, num_warps=8)
    return sorted_pairs, block_table


def grouped_experts_triton(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                           expert_ids: torch.Tensor, expert_weights: torch.Tensor,
                           config: LaunchConfig | None = None) -> torch.Tensor:
    """Same contract as `grouped_experts` (weights with a contiguous last dim, any other strides); `config` forces
    a launch config."""
    _check(hidden, gate_up, down, expert_ids, expert_weights)
    rows, hidden_size = hidden.shape
    num_experts, inter_size, top_k = gate_up.shape[0], down.shape[2], expert_ids.shape[1]
    out = torch.empty(rows, hidden_size, device=hidden.device, dtype=hidden.dtype)
    pairs = rows * top_k
    if pairs == 0 or hidden_size == 0 or inter_size == 0:
        return out.zero_()
    config = config or launch_config(pairs, num_experts, hidden.dtype)
    tiles = (config.block_m, config.gate_up_n, config.down_n, config.block_k)
    if any(tile < 16 or tile & (tile - 1) for tile in tiles):
        raise SpecdraftError(f"grouped_experts: launch config {config}: its blocks must be powers of two >= 16 "
                             "(tl.dot's smallest tile)")
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    gate_up, down = (w if w.stride(-1) == 1 else w.contiguous() for w in (gate_up, down))
    expert_ids, expert_weights = expert_ids.contiguous(), expert_weights.contiguous()
    sorted_pairs, block_table = route_pairs(expert_ids, num_experts, config.block_m)
    num_blocks, device = block_table.shape[1], hidden.device
    upcast = hidden.dtype == torch.bfloat16 and triton_interpreting()  # the interpreter multiplies bf16 bits as ints
    flags = dict(BLOCK_M=config.block_m, BLOCK_K=config.block_k, UPCAST=upcast,
                 DOT_PRECISION="ieee" if upcast or hidden.dtype == torch.float32 else "tf32",
                 num_warps=config.warps, num_stages=config.stages)
    act = torch.empty(pairs, inter_size, device=device, dtype=hidden.dtype)  # [P, I] by sorted position
    _gate_up_kernel[(num_blocks, triton.cdiv(inter_size, config.gate_up_n))](
        hidden, gate_up, act, sorted_pairs, *block_table, hidden_size, inter_size, hidden.stride(0),
        gate_up.stride(0), gate_up.stride(1), TOP_K=top_k, K_STEPS=triton.cdiv(hidden_size, config.block_k),
        EVEN_K=hidden_size % config.block_k == 0, BLOCK_N=config.gate_up_n, **flags)
    part = torch.empty(pairs, hidden_size, device=device, dtype=torch.float32)  # [P, H] by pair, weighted
    _down_kernel[(num_blocks, triton.cdiv(hidden_size, config.down_n))](
        act, down, expert_weights, part, sorted_pairs, *block_table, hidden_size, inter_size, down.stride(0),
        down.stride(1), K_STEPS=triton.cdiv(inter_size, config.block_k), EVEN_K=inter_size % config.block_k == 0,
        BLOCK_N=config.down_n, **flags)
    block = min(1024, next_power_of_2(hidden_size))
    _sum_kernel[(rows, triton.cdiv(hidden_size, block))](part, expert_ids, out, hidden_size, num_experts,
                                                         TOP_K=top_k, BLOCK=block, num_warps=4)
    return out
