"""(Residual add +) RMSNorm in one launch: one program per row holds the whole row (a power-of-two block with a
mask, 1024 for hidden 576) and follows the reference's rounding steps: the residual sum rounded to the input
dtype, the float32 mean of squares, rsqrt, and either the cast to the input dtype before the weight product
(HF Llama) or the weight product in float32 (`WEIGHT_IN_FP32`). A product of two bfloat16/float16 values is exact
in float32, so one rounding after it is what PyTorch's half-precision multiply does. Floating-point contraction
into FMAs is disabled at launch, so float32 rounds as the reference's separate ops do. The only freedom left is
the order of the float32 sum of squares, as between any two reductions."""

import torch
import triton
import triton.language as tl

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.rounding import round_as


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, summed_ptr, hidden, eps, x_stride, residual_stride,
                     HAS_RESIDUAL: tl.constexpr, WEIGHT_IN_FP32: tl.constexpr, BLOCK_H: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    in_row = cols < hidden
    x32 = tl.load(x_ptr + row * x_stride + cols, mask=in_row, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_stride + cols, mask=in_row, other=0.0).to(tl.float32)
        x32 = round_as(x32 + residual, dtype)
        tl.store(summed_ptr + row * hidden + cols, x32.to(dtype), mask=in_row)
    mean_square = tl.div_rn(tl.sum(x32 * x32, axis=0), hidden.to(tl.float32))
    normed = x32 * tl.math.rsqrt(mean_square + eps)  # [BLOCK_H] float32
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    if WEIGHT_IN_FP32:
        out = normed * weight
    else:
        out = round_as(normed, dtype) * weight
    tl.store(out_ptr + row * hidden + cols, round_as(out, dtype).to(dtype), mask=in_row)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, weight_in_fp32: bool) -> None:
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or x.stride(-1) != 1:
        raise SpecdraftError(f"rms_norm: x must be float32/bfloat16/float16 with a contiguous last dim, got {x.dtype}")
    if weight.shape != x.shape[-1:] or (not weight_in_fp32 and weight.dtype != x.dtype):
        raise SpecdraftError(f"rms_norm: weight {tuple(weight.shape)} {weight.dtype} does not fit x "
                             f"{tuple(x.shape)} {x.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1):
        raise SpecdraftError(f"rms_norm: residual {tuple(residual.shape)} {residual.dtype} does not match x")


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                    weight_in_fp32: bool = False):
    """Same contract as `rms_norm`."""
    _check(x, weight, residual, weight_in_fp32)
    hidden = x.shape[-1]
    block = next_power_of_2(hidden)
    rows_in = x.reshape(-1, hidden)  # [R, H] (a view where the strides allow)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    summed = torch.empty_like(out) if residual is not None else out
    residual_rows = residual.reshape(-1, hidden) if residual is not None else rows_in
    if rows_in.shape[0] > 0:
        _rms_norm_kernel[(rows_in.shape[0],)](
            rows_in, residual_rows, weight, out, summed, hidden, eps, rows_in.stride(0), residual_rows.stride(0),
            HAS_RESIDUAL=residual is not None, WEIGHT_IN_FP32=weight_in_fp32,
            BLOCK_H=block, num_warps=4 if block <= 1024 else 8 if block <= 4096 else 16, enable_fp_fusion=False)
    return out if residual is None else (out, summed)
