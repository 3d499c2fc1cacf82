"""The quantized linear layer in one launch (two when the input columns are split). Every program streams its
output block's 8- or 4-bit weights along the input and dequantizes each tile in registers to the bits the
reference computes (the float32 product, for int4 plus the minimum, rounded once to the activations' dtype; the
int4 product of a 4-bit code and a float16 scale is exact in float32, so a fused multiply-add rounds as the
reference's two steps do).

Two kinds of program, by `LaunchPlan.gemv`:
- gemv (an int4 decode step of a small weight: `GEMV_ROWS` rows or fewer): one row a program, the dequantized
  tile multiplied into a float32 accumulator element by element and summed once at the end: no tensor-core tile
  padded to 16 rows, the shortest program for a call its launch latency bounds. Rows beyond the first re-read the
  weights from L2 (their programs run side by side).
- dot (everything else: a large weight's decode step, a tree's verify, a prefill, training features): tiles of
  rows against tiles of outputs through tl.dot.
int4 codes become floats through their bits (or-ing them into 2^23's mantissa) rather than through the slower
integer-to-float conversion, and the masks compare with the whole input so that the weights load in vectors.
Either kind splits the input columns into up to `MAX_SPLITS` parts when the output blocks alone would not fill
the GPU, the parts summed in float32 by a second launch in a fixed order (the same bits every run). The defaults
of `launch_plan` come from `tools/bench/quant_plans.py` on an H200.
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels import launch, triton_interpreting
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.quant_linear.reference import QuantizedWeight
from specdraft.kernels.rounding import dot_operand, round_as

GEMV_ROWS = 4
MAX_SPLITS = 8
PROGRAMS_PER_SM = 8
"""Programs the splits aim at per streaming multiprocessor: a decode step needs many loads in flight."""
SMALL_BYTES = 1 << 20
"""Below this a weight's call is bound by its programs' latency rather than by its bytes."""
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class LaunchPlan(NamedTuple):
    """How one call is cut into programs (`launch_plan`); tests and the plan sweep force fields."""

    gemv: bool
    block_m: int
    block_n: int
    block_k: int
    splits: int
    per_split: int  # input columns a split (a multiple of block_k)
    warps: int
    stages: int
    swap: bool = False  # dot programs: the weights as tl.dot's first operand (`_mma`)


@triton.jit
def _as_dtype(x, DTYPE: tl.constexpr, INTERPRETED: tl.constexpr):
    """float32 x rounded to DTYPE (to nearest, ties to even): the GPU's cast; under the interpreter, whose bfloat16
    cast truncates, `round_as`."""
    if INTERPRETED:
        return round_as(x, DTYPE).to(DTYPE)
    else:
        return x.to(DTYPE)


@triton.jit
def _dot_weight(w, DTYPE: tl.constexpr, UPCAST: tl.constexpr, INTERPRETED: tl.constexpr):
    """A dequantized float32 tile rounded to DTYPE, as tl.dot takes it (float32 where `dot_operand` upcasts)."""
    if DTYPE == tl.float32:
        return w
    elif UPCAST:
        return round_as(w, DTYPE)
    else:
        return _as_dtype(w, DTYPE, INTERPRETED)


@triton.jit
def _rounded_f32(w, DTYPE: tl.constexpr):
    """A dequantized float32 tile rounded to DTYPE and kept in float32 (exact): the gemv's multiplicand."""
    if DTYPE == tl.float32:
        return w
    else:
        return round_as(w, DTYPE)


@triton.jit
def _nibbles_f32(codes):
    """int32 codes in [0, 16) -> float32, exactly: 2^23 + code has the code in its mantissa, then 2^23 is taken
    away (two cheap instructions instead of a conversion)."""
    return (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _halves(x, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [ROWS, BK] -> its even and its odd columns, each [ROWS, BK/2] (the low and high nibbles' inputs)."""
    return tl.split(tl.reshape(x, (ROWS, BLOCK_K // 2, 2)))


@triton.jit
def _int4_gemv(x_row, w_rows, scale_ptr, min_ptr, n, in_n, in_features, in_bytes, scale_stride, k_begin,
               K_STEPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """One row's partial sums [BN] over K_STEPS groups of the input (BLOCK_K is the group). The masks compare
    with the whole input (a split's steps never reach the next split's), so that the weights load in vectors."""
    acc = tl.zeros((BLOCK_N, BLOCK_K // 2), dtype=tl.float32)
    for step in range(K_STEPS):
        k0 = k_begin + step * BLOCK_K
        k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        pairs = k_begin // 2 + step * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)  # [BK/2] byte columns
        packed = tl.load(w_rows + pairs[None, :], mask=in_n[:, None] & (pairs < in_bytes)[None, :],
                         other=0).to(tl.int32)  # [BN, BK/2]: input columns 2j (low nibble) and 2j + 1 (high)
        group = k0 // BLOCK_K
        in_group = in_n & (k0 < in_features)  # a split's steps past the input read no scales (the last row's end)
        scale = tl.load(scale_ptr + n * scale_stride + group, mask=in_group, other=0.0).to(tl.float32)[:, None]
        lowest = tl.load(min_ptr + n * scale_stride + group, mask=in_group, other=0.0).to(tl.float32)[:, None]
        x = tl.load(x_row + k, mask=k < in_features, other=0.0).to(tl.float32)[None, :]  # [1, BK]
        x_even, x_odd = _halves(x, 1, BLOCK_K)
        w_even = _rounded_f32(_nibbles_f32(packed & 15) * scale + lowest, DTYPE)  # [BN, BK/2]
        w_odd = _rounded_f32(_nibbles_f32(packed >> 4) * scale + lowest, DTYPE)
        acc += w_even * x_even + w_odd * x_odd
    return tl.sum(acc, axis=1)


@triton.jit
def _int8_gemv(x_row, w_rows, scale_ptr, n, in_n, in_features, k_begin, K_STEPS: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """One row's partial sums [BN] over K_STEPS blocks of the input."""
    scale = tl.load(scale_ptr + n, mask=in_n, other=0.0)[:, None]  # [BN, 1] float32
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for step in range(K_STEPS):
        k = k_begin + step * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
        in_k = k < in_features
        codes = tl.load(w_rows + k[None, :], mask=in_n[:, None] & in_k[None, :], other=0)  # [BN, BK] int8
        x = tl.load(x_row + k, mask=in_k, other=0.0).to(tl.float32)[None, :]
        acc += _rounded_f32(codes.to(tl.float32) * scale, DTYPE) * x
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_kernel(x_ptr, data_ptr, scale_ptr, min_ptr, bias_ptr, out_ptr, out_features, in_features, in_bytes,
                 x_stride, data_stride, scale_stride, split_stride, K_STEPS: tl.constexpr, BITS: tl.constexpr,
                 HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 INTERPRETED: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BN]
    split = tl.program_id(2)
    in_n = n < out_features
    k_begin = split * (K_STEPS * BLOCK_K)
    x_row = x_ptr + row * x_stride
    w_rows = data_ptr + n[:, None] * data_stride  # [BN, 1]
    if BITS == 8:
        total = _int8_gemv(x_row, w_rows, scale_ptr, n, in_n, in_features, k_begin, K_STEPS, BLOCK_N, BLOCK_K, dtype)
    else:
        total = _int4_gemv(x_row, w_rows, scale_ptr, min_ptr, n, in_n, in_features, in_bytes, scale_stride, k_begin,
                           K_STEPS, BLOCK_N, BLOCK_K, dtype)
    at = row * out_features + n  # [BN] in a contiguous [rows, out] output
    if PARTIAL:
        tl.store(out_ptr + split * split_stride + at, total, mask=in_n)
    else:
        if HAS_BIAS:
            total += tl.load(bias_ptr + n, mask=in_n, other=0.0).to(tl.float32)
        tl.store(out_ptr + at, _as_dtype(total, dtype, INTERPRETED), mask=in_n)


@triton.jit
def _mma(acc, x, w, SWAP: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + x w^T ([BM, BN]), or with SWAP acc + w x^T ([BN, BM]): the dequantized weights as the first operand,
    straight from registers, and the few rows as the second (a small M's tile then pads the rows, not the
    weights)."""
    if SWAP:
        return acc + tl.dot(w, tl.trans(dot_operand(x, UPCAST)), input_precision=DOT_PRECISION)
    else:
        return acc + tl.dot(dot_operand(x, UPCAST), tl.trans(w), input_precision=DOT_PRECISION)


@triton.jit
def _dot_kernel(x_ptr, data_ptr, scale_ptr, min_ptr, bias_ptr, out_ptr, rows, out_features, in_features, in_bytes,
                x_stride, data_stride, scale_stride, split_stride, K_STEPS: tl.constexpr, BITS: tl.constexpr,
                HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, SWAP: tl.constexpr, UPCAST: tl.constexpr, INTERPRETED: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BN]
    split = tl.program_id(2)
    in_m, in_n = m < rows, n < out_features
    k_begin = split * (K_STEPS * BLOCK_K)  # a split's steps never reach the next's: masks compare with the input
    x_rows = x_ptr + m.to(tl.int64)[:, None] * x_stride  # [BM, 1]
    w_rows = data_ptr + n[:, None] * data_stride  # [BN, 1]
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BITS == 8:
        scale = tl.load(scale_ptr + n, mask=in_n, other=0.0)[:, None]  # [BN, 1] float32
        for step in range(K_STEPS):  # constant trip count (the interpreter's loops need one); the tail is masked
            k = k_begin + step * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
            in_k = k < in_features
            x = tl.load(x_rows + k[None, :], mask=in_m[:, None] & in_k[None, :], other=0.0)  # [BM, BK]
            codes = tl.load(w_rows + k[None, :], mask=in_n[:, None] & in_k[None, :], other=0)  # [BN, BK] int8
            w = _dot_weight(codes.to(tl.float32) * scale, dtype, UPCAST, INTERPRETED)
            acc = _mma(acc, x, w, SWAP, UPCAST, DOT_PRECISION)
    else:
        for step in range(K_STEPS):  # BLOCK_K is the group: one scale and one minimum a row
            k0 = k_begin + step * BLOCK_K
            k = k0 + tl.arange(0, BLOCK_K)  # [BK]
            pairs = k_begin // 2 + step * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)  # [BK/2] byte columns
            packed = tl.load(w_rows + pairs[None, :], mask=in_n[:, None] & (pairs < in_bytes)[None, :],
                             other=0).to(tl.int32)  # [BN, BK/2]
            group = k0 // BLOCK_K
            in_group = in_n & (k0 < in_features)  # past the input (a split's tail): no scales read
            scale = tl.load(scale_ptr + n * scale_stride + group, mask=in_group, other=0.0).to(tl.float32)[:, None]
            lowest = tl.load(min_ptr + n * scale_stride + group, mask=in_group, other=0.0).to(tl.float32)[:, None]
            w_even = _dot_weight(_nibbles_f32(packed & 15) * scale + lowest, dtype, UPCAST, INTERPRETED)
            w_odd = _dot_weight(_nibbles_f32(packed >> 4) * scale + lowest, dtype, UPCAST, INTERPRETED)
            x = tl.load(x_rows + k[None, :], mask=in_m[:, None] & (k < in_features)[None, :], other=0.0)  # [BM, BK]
            x_even, x_odd = _halves(x, BLOCK_M, BLOCK_K)
            acc = _mma(acc, x_even, w_even, SWAP, UPCAST, DOT_PRECISION)
            acc = _mma(acc, x_odd, w_odd, SWAP, UPCAST, DOT_PRECISION)
    if SWAP:
        at = m.to(tl.int64)[None, :] * out_features + n[:, None]  # [BN, BM] in a contiguous [rows, out] output
        inside = in_n[:, None] & in_m[None, :]
        bias_at = n[:, None]
    else:
        at = m.to(tl.int64)[:, None] * out_features + n[None, :]  # [BM, BN]
        inside = in_m[:, None] & in_n[None, :]
        bias_at = n[None, :]
    if PARTIAL:
        tl.store(out_ptr + split * split_stride + at, acc, mask=inside)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + bias_at, mask=bias_at < out_features, other=0.0).to(tl.float32)
        tl.store(out_ptr + at, _as_dtype(acc, dtype, INTERPRETED), mask=inside)


@triton.jit
def _sum_splits_kernel(part_ptr, bias_ptr, out_ptr, numel, out_features, split_stride, SPLITS: tl.constexpr,
                       HAS_BIAS: tl.constexpr, INTERPRETED: tl.constexpr, BLOCK: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    inside = at < numel
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(SPLITS):  # in order: the same sum every run
        total += tl.load(part_ptr + split * split_stride + at, mask=inside, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + at % out_features, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, _as_dtype(total, dtype, INTERPRETED), mask=inside)


def _check(x: torch.Tensor, weight: QuantizedWeight, bias) -> None:
    if x.dtype not in _DTYPES or x.shape[-1] != weight.in_features:
        raise SpecdraftError(f"quant_linear: x {tuple(x.shape)} {x.dtype} must be float32/bfloat16/float16 with "
                             f"{weight.in_features} input columns")
    if weight.bits == 4 and (weight.group_size < 32 or weight.group_size & (weight.group_size - 1)):
        raise SpecdraftError(f"quant_linear: the int4 kernel takes groups of a power of two >= 32 columns, got "
                             f"{weight.group_size}")
    if bias is not None and bias.shape != (weight.out_features,):
        raise SpecdraftError(f"quant_linear: bias {tuple(bias.shape)} does not fit {weight.out_features} outputs")


def _int4_defaults(rows: int, weight: QuantizedWeight, gemv: bool) -> dict:
    """Measured on an H200 (tools/bench/quant_plans.py): a small weight (a SmolLM2 layer) is bound by its
    programs' latency, best in narrow blocks and, for a decode step, gemv programs of 8 warps; a large one by
    bytes in flight, best in wide blocks of 4 warps and 3 stages."""
    small = weight.data.numel() < SMALL_BYTES
    if gemv:
        return dict(block_m=1, block_n=32, block_k=weight.group_size, warps=8, stages=4)
    block_n = 32 if small else 128 if rows <= 16 else 64
    return dict(block_m=min(64, max(16, next_power_of_2(rows))), block_n=block_n, block_k=weight.group_size,
                warps=4, stages=3)


def _int8_defaults(rows: int, weight: QuantizedWeight, gemv: bool) -> dict:
    """Wide input blocks for few rows (read the weights in long runs), square tiles for many."""
    few = rows <= 16
    return dict(block_m=1 if gemv else 16 if few else min(64, next_power_of_2(rows)), block_n=32 if few else 64,
                block_k=256 if few else 64, warps=4, stages=4 if few else 3)


def _default_splits(rows: int, out_features: int, block_m: int, block_n: int, k_blocks: int,
                    device: torch.device) -> int:
    """Input splits that bring the programs near PROGRAMS_PER_SM a multiprocessor, never a split under one block."""
    programs = -(-rows // block_m) * -(-out_features // block_n)
    wanted = PROGRAMS_PER_SM * launch.target_programs(device) // 2 // max(1, programs)
    return max(1, min(MAX_SPLITS, k_blocks, wanted))


def launch_plan(rows: int, weight: QuantizedWeight, device: torch.device, **forced) -> LaunchPlan:
    """The plan for `rows` rows (module docstring); keyword arguments force `LaunchPlan` fields (per_split
    follows from the others)."""
    small = weight.data.numel() < SMALL_BYTES
    gemv = forced.pop("gemv", rows <= GEMV_ROWS and small and weight.bits == 4)
    plan = (_int4_defaults if weight.bits == 4 else _int8_defaults)(rows, weight, gemv)
    plan.update(forced)
    if gemv:
        plan["block_m"] = 1
    k_blocks = triton.cdiv(weight.in_features, plan["block_k"])
    splits = plan.pop("splits", None) or _default_splits(rows, weight.out_features, plan["block_m"],
                                                         plan["block_n"], k_blocks, device)
    per_split = triton.cdiv(k_blocks, max(1, min(splits, k_blocks))) * plan["block_k"]
    return LaunchPlan(gemv=gemv, splits=triton.cdiv(weight.in_features, per_split), per_split=per_split, **plan)


def quant_linear_triton(x: torch.Tensor, weight: QuantizedWeight, bias=None, plan: LaunchPlan = None) -> torch.Tensor:
    """Same contract as `quant_linear`; `plan` forces a launch plan (tests, the plan sweep)."""
    _check(x, weight, bias)
    x_rows = x.reshape(-1, weight.in_features)
    if x_rows.stride(-1) != 1:
        x_rows = x_rows.contiguous()
    rows, out_features = x_rows.shape[0], weight.out_features
    out = torch.empty(rows, out_features, device=x.device, dtype=x.dtype)
    if rows == 0:
        return out.view(*x.shape[:-1], out_features)
    plan = plan or launch_plan(rows, weight, x.device)
    interpreted = triton_interpreting()
    partial = torch.empty(plan.splits, rows, out_features, device=x.device, dtype=torch.float32) \
        if plan.splits > 1 else out
    mins = weight.mins if weight.mins is not None else weight.scales
    common = (x_rows, weight.data, weight.scales, mins, bias if bias is not None else out, partial)
    strides = (x_rows.stride(0), weight.data.stride(0), weight.scales.stride(0) if weight.bits == 4 else 0,
               rows * out_features)
    flags = dict(K_STEPS=plan.per_split // plan.block_k, BITS=weight.bits, HAS_BIAS=bias is not None,
                 PARTIAL=plan.splits > 1, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, INTERPRETED=interpreted,
                 num_warps=plan.warps, num_stages=plan.stages)
    if plan.gemv:
        grid = (rows, triton.cdiv(out_features, plan.block_n), plan.splits)
        _gemv_kernel[grid](*common, out_features, weight.in_features, weight.data.shape[1], *strides, **flags)
    else:
        upcast = x.dtype == torch.bfloat16 and interpreted  # the interpreter multiplies bfloat16 bits as integers
        grid = (triton.cdiv(rows, plan.block_m), triton.cdiv(out_features, plan.block_n), plan.splits)
        _dot_kernel[grid](*common, rows, out_features, weight.in_features, weight.data.shape[1], *strides,
                          BLOCK_M=plan.block_m, SWAP=plan.swap,
                          UPCAST=upcast, DOT_PRECISION="ieee" if upcast or x.dtype == torch.float32 else "tf32",
                          **flags)
    if plan.splits > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(rows * out_features, block),)](
            partial, bias if bias is not None else out, out, rows * out_features, out_features,
            rows * out_features, SPLITS=plan.splits, HAS_BIAS=bias is not None, INTERPRETED=interpreted,
            BLOCK=block, num_warps=4)
    return out.view(*x.shape[:-1], out_features)
