"""The quantized linear layer in one launch (two when the input columns are split): programs over (row block,
output block, input split); each streams its output block's 8- or 4-bit weights along the input, dequantizes a
tile in registers exactly as the reference does (float32 product, then for int4 the sum, no fused multiply-add,
one rounding to the activations' dtype) and accumulates tl.dot in float32.

Few rows (a decode step, a chain or the few rows a hierarchical verify runs: `GEMV_ROWS` or fewer) are a GEMV:
memory-bound, the weights read once, 16-row dot tiles (the smallest) mostly padding. A weight of `SPLIT_MIN_BYTES`
or more whose output blocks would not fill the GPU is split along its input into up to `MAX_SPLITS` parts,
summed in float32 in a second launch (in a fixed order: the same bits every run). More rows (a tree's verify, a
prefill, training features) take 64-row tiles and no split.
"""
import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels import launch, triton_interpreting
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.quant_linear.reference import QuantizedWeight
from specdraft.kernels.rounding import dot_operand, round_as

GEMV_ROWS = 16
SPLIT_MIN_BYTES = 4 << 20
MAX_SPLITS = 8
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
def _quant_linear_kernel(x_ptr, data_ptr, scale_ptr, min_ptr, bias_ptr, out_ptr, rows, out_features, in_features,
                         x_stride, data_stride, scale_stride, split_stride, K_STEPS: tl.constexpr, BITS: tl.constexpr,
                         HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, INTERPRETED: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BN]
    split = tl.program_id(2)
    in_m, in_n = m < rows, n < out_features
    k_begin = split * (K_STEPS * BLOCK_K)
    k_end = tl.minimum(k_begin + K_STEPS * BLOCK_K, in_features)
    x_rows = x_ptr + m.to(tl.int64)[:, None] * x_stride  # [BM, 1]
    w_rows = data_ptr + n[:, None] * data_stride  # [BN, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BITS == 8:
        scale = tl.load(scale_ptr + n, mask=in_n, other=0.0)[:, None]  # [BN, 1] float32
        for step in range(K_STEPS):  # constant trip count (the interpreter's loops need one); the tail is masked
            k = k_begin + step * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
            in_k = k < k_end
            x = tl.load(x_rows + k[None, :], mask=in_m[:, None] & in_k[None, :], other=0.0)  # [BM, BK]
            codes = tl.load(w_rows + k[None, :], mask=in_n[:, None] & in_k[None, :], other=0)  # [BN, BK] int8
            w = _dot_weight(codes.to(tl.float32) * scale, dtype, UPCAST, INTERPRETED)
            acc += tl.dot(dot_operand(x, UPCAST), tl.trans(w), input_precision=DOT_PRECISION)
    else:
        for step in range(K_STEPS):  # BLOCK_K is the group: one scale and one minimum a row
            k0 = k_begin + step * BLOCK_K
            pairs = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # [BK/2] byte columns: input columns 2j and 2j + 1
            even = 2 * pairs
            in_even, in_odd = even < k_end, even + 1 < k_end
            packed = tl.load(w_rows + pairs[None, :], mask=in_n[:, None] & in_even[None, :], other=0)  # [BN, BK/2]
            group = k0 // BLOCK_K
            scale = tl.load(scale_ptr + n * scale_stride + group, mask=in_n, other=0.0).to(tl.float32)[:, None]
            lowest = tl.load(min_ptr + n * scale_stride + group, mask=in_n, other=0.0).to(tl.float32)[:, None]
            w_even = _dot_weight((packed & 15).to(tl.float32) * scale + lowest, dtype, UPCAST, INTERPRETED)
            w_odd = _dot_weight((packed >> 4).to(tl.float32) * scale + lowest, dtype, UPCAST, INTERPRETED)
            x_even = tl.load(x_rows + even[None, :], mask=in_m[:, None] & in_even[None, :], other=0.0)  # [BM, BK/2]
            x_odd = tl.load(x_rows + even[None, :] + 1, mask=in_m[:, None] & in_odd[None, :], other=0.0)
            acc += tl.dot(dot_operand(x_even, UPCAST), tl.trans(w_even), input_precision=DOT_PRECISION)
            acc += tl.dot(dot_operand(x_odd, UPCAST), tl.trans(w_odd), input_precision=DOT_PRECISION)
    at = m.to(tl.int64)[:, None] * out_features + n[None, :]  # [BM, BN] in a contiguous [rows, out] output
    inside = in_m[:, None] & in_n[None, :]
    if PARTIAL:
        tl.store(out_ptr + split * split_stride + at, acc, mask=inside)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=in_n, other=0.0).to(tl.float32)[None, :]
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


def launch_plan(rows: int, weight: QuantizedWeight, device: torch.device, splits=None):
    """-> (BLOCK_M, BLOCK_N, BLOCK_K, splits, input columns a split) for `rows` rows (module docstring); `splits`
    forces a split count (tests)."""
    gemv = rows <= GEMV_ROWS
    block_m = 16 if gemv else min(64, max(16, next_power_of_2(rows)))
    block_n = 32 if gemv and weight.bits == 8 else 64
    block_k = weight.group_size if weight.bits == 4 else 256 if gemv else 64
    k_blocks = triton.cdiv(weight.in_features, block_k)
    if splits is None:
        big = weight.data.numel() * weight.data.element_size() >= SPLIT_MIN_BYTES
        wanted = launch.target_programs(device) // triton.cdiv(weight.out_features, block_n)
        splits = max(1, min(MAX_SPLITS, k_blocks, wanted)) if gemv and big else 1
    per_split = triton.cdiv(k_blocks, max(1, min(splits, k_blocks))) * block_k
    return block_m, block_n, block_k, triton.cdiv(weight.in_features, per_split), per_split


def quant_linear_triton(x: torch.Tensor, weight: QuantizedWeight, bias=None, splits=None) -> torch.Tensor:
    """Same contract as `quant_linear`; `splits` forces the input split (tests)."""
    _check(x, weight, bias)
    x_rows = x.reshape(-1, weight.in_features)
    if x_rows.stride(-1) != 1:
        x_rows = x_rows.contiguous()
    rows, out_features = x_rows.shape[0], weight.out_features
    out = torch.empty(rows, out_features, device=x.device, dtype=x.dtype)
    if rows == 0:
        return out.view(*x.shape[:-1], out_features)
    block_m, block_n, block_k, splits, per_split = launch_plan(rows, weight, x.device, splits)
    interpreted = triton_interpreting()
    upcast = x.dtype == torch.bfloat16 and interpreted  # the interpreter multiplies bfloat16 bits as integers
    partial = torch.empty(splits, rows, out_features, device=x.device, dtype=torch.float32) if splits > 1 else out
    mins = weight.mins if weight.mins is not None else weight.scales
    grid = (triton.cdiv(rows, block_m), triton.cdiv(out_features, block_n), splits)
    _quant_linear_kernel[grid](
        x_rows, weight.data, weight.scales, mins, bias if bias is not None else out, partial, rows, out_features,
        weight.in_features, x_rows.stride(0), weight.data.stride(0), weight.scales.stride(0) if weight.bits == 4 else 0,
        rows * out_features, K_STEPS=per_split // block_k, BITS=weight.bits, HAS_BIAS=bias is not None, PARTIAL=splits > 1,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast, INTERPRETED=interpreted,
        DOT_PRECISION="ieee" if upcast or x.dtype == torch.float32 else "tf32", num_warps=4,
        num_stages=4 if rows <= GEMV_ROWS else 3, enable_fp_fusion=False)
    if splits > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(rows * out_features, block),)](
            partial, bias if bias is not None else out, out, rows * out_features, out_features,
            rows * out_features, SPLITS=splits, HAS_BIAS=bias is not None, INTERPRETED=interpreted, BLOCK=block, num_warps=4)
    return out.view(*x.shape[:-1], out_features)
