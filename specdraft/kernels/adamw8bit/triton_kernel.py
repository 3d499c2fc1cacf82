"""Blockwise 8-bit AdamW as one Triton launch per tensor: each program takes `BLOCKS_PER_PROGRAM` quantization
blocks ([R, 256] elements), reads the float32 param and the gradient, the int8/uint8 moment codes and the blocks'
two scales, dequantizes, runs the AdamW update in float32, writes the param, reduces each block's new absmax of m
and max of sqrt(v) in registers and writes the requantized codes and scales: 16 bytes of traffic per parameter
(4 + 4 read and 4 written for the param and the gradient, 1 + 1 each way for the codes), nothing staged through
memory.

It follows the reference (reference.py) operation for operation: IEEE division and square root (`div_rn`,
`sqrt_rn`, not the approximate ones; one division per element, for the update, and one reciprocal per block and
scale, as the reference multiplies by the levels' steps and the scales' reciprocals), floating-point
contraction into FMAs disabled at launch, the same floor(x + 0.5) rounding, and masked tail lanes computed as
the reference's zero padding. A block's max is exact whatever the reduction order, so the codes, the scales and
the param come out with the reference's bits.
Tensors below the quantization threshold take the same kernel with float32 moments (`QUANTIZED=False`).
"""

import torch
import triton
import triton.language as tl

from specdraft.kernels.adamw8bit.reference import (BLOCK, FIRST_LEVELS, FIRST_STEP, SECOND_LEVELS,
                                                   SECOND_STEP, Moments, StepScalars, check_inputs, num_blocks,
                                                   update_coefficients)

BLOCKS_PER_PROGRAM = 8
_FIRST_LEVELS = tl.constexpr(FIRST_LEVELS)
_SECOND_LEVELS = tl.constexpr(SECOND_LEVELS)
_FIRST_STEP = tl.constexpr(FIRST_STEP)
_SECOND_STEP = tl.constexpr(SECOND_STEP)


@triton.jit
def _ratio(magnitude, scale):
    """magnitude [R, BLOCK] times 1 / scale [R, 1] (one IEEE division per block); an all-zero block (scale 0)
    multiplies by 1."""
    return magnitude * tl.div_rn(1.0, tl.where(scale > 0, scale, 1.0))


@triton.jit
def _dequantized(first_ptr, second_ptr, first_scale_ptr, second_scale_ptr, offsets, in_tensor, blocks, in_blocks,
                 QUANTIZED: tl.constexpr):
    """-> (m, v) [R, BLOCK] float32 for the tile at `offsets`; tail lanes read as the reference's zero padding."""
    if QUANTIZED:
        first_level = tl.load(first_ptr + offsets, mask=in_tensor, other=0).to(tl.float32) * _FIRST_STEP
        first_scale = tl.load(first_scale_ptr + blocks, mask=in_blocks, other=0.0)[:, None]  # [R, 1]
        first = first_level * tl.abs(first_level) * first_scale
        second_code = tl.load(second_ptr + offsets, mask=in_tensor, other=0).to(tl.float32)
        second_level = (second_code + 1.0) * _SECOND_STEP
        root = second_level * second_level * tl.load(second_scale_ptr + blocks, mask=in_blocks, other=0.0)[:, None]
        second = root * root
    else:
        first = tl.load(first_ptr + offsets, mask=in_tensor, other=0.0)
        second = tl.load(second_ptr + offsets, mask=in_tensor, other=0.0)
    return first, second


@triton.jit
def _store_quantized(first_ptr, second_ptr, first_scale_ptr, second_scale_ptr, first, root, offsets, in_tensor,
                     blocks, in_blocks):
    """m, sqrt(v) [R, BLOCK] -> int8 / uint8 codes and per-block scales (reference.quantize_first/_second_root)."""
    first_magnitude = tl.abs(first)
    first_scale = tl.max(first_magnitude, axis=1)  # [R]
    level = tl.floor(tl.sqrt_rn(_ratio(first_magnitude, first_scale[:, None])) * _FIRST_LEVELS + 0.5)
    tl.store(first_ptr + offsets, tl.where(first < 0, -level, level).to(tl.int8), mask=in_tensor)
    tl.store(first_scale_ptr + blocks, first_scale, mask=in_blocks)
    root_scale = tl.max(root, axis=1)  # [R]
    code = tl.floor(tl.sqrt_rn(_ratio(root, root_scale[:, None])) * _SECOND_LEVELS + 0.5) - 1.0
    tl.store(second_ptr + offsets, tl.minimum(tl.maximum(code, 0.0), 255.0).to(tl.uint8), mask=in_tensor)
    tl.store(second_scale_ptr + blocks, root_scale, mask=in_blocks)


@triton.jit
def _adamw8bit_kernel(param_ptr, grad_ptr, first_ptr, second_ptr, first_scale_ptr, second_scale_ptr, numel,
                      beta1, one_minus_beta1, beta2, one_minus_beta2, decay, step_size, inverse_bias2_sqrt, eps,
                      QUANTIZED: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr):
    blocks = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [R] quantization blocks
    offsets = blocks[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]  # [R, BLOCK]
    in_tensor = offsets < numel
    in_blocks = blocks * BLOCK_SIZE < numel
    param = tl.load(param_ptr + offsets, mask=in_tensor, other=0.0)
    grad = tl.load(grad_ptr + offsets, mask=in_tensor, other=0.0).to(tl.float32)
    first, second = _dequantized(first_ptr, second_ptr, first_scale_ptr, second_scale_ptr, offsets, in_tensor,
                                 blocks, in_blocks, QUANTIZED)
    first = beta1 * first + one_minus_beta1 * grad
    second = beta2 * second + one_minus_beta2 * (grad * grad)
    root = tl.sqrt_rn(second)
    denominator = root * inverse_bias2_sqrt + eps
    tl.store(param_ptr + offsets, param * decay - step_size * tl.div_rn(first, denominator), mask=in_tensor)
    if QUANTIZED:
        _store_quantized(first_ptr, second_ptr, first_scale_ptr, second_scale_ptr, first, root, offsets, in_tensor,
                         blocks, in_blocks)
    else:
        tl.store(first_ptr + offsets, first, mask=in_tensor)
        tl.store(second_ptr + offsets, second, mask=in_tensor)


def adamw8bit_step_triton(param: torch.Tensor, grad: torch.Tensor, moments: Moments, scalars: StepScalars) -> None:
    """Same contract as `adamw8bit_step`: param and moments updated in place."""
    check_inputs(param, grad, moments)
    numel = param.numel()
    if numel == 0:
        return
    decay, step_size, inverse_bias2_sqrt = update_coefficients(scalars)
    first_scales = moments.first_scales if moments.quantized else moments.first
    second_scales = moments.second_scales if moments.quantized else moments.second
    grid = (triton.cdiv(num_blocks(numel), BLOCKS_PER_PROGRAM),)
    _adamw8bit_kernel[grid](
        param, grad.contiguous(), moments.first, moments.second, first_scales, second_scales, numel,
        scalars.beta1, 1.0 - scalars.beta1, scalars.beta2, 1.0 - scalars.beta2, decay, step_size, inverse_bias2_sqrt,
        scalars.eps, QUANTIZED=moments.quantized, BLOCK_SIZE=BLOCK, ROWS=BLOCKS_PER_PROGRAM, num_warps=8,
        enable_fp_fusion=False)
