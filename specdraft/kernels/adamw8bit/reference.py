"""Blockwise 8-bit AdamW, the spec: one tensor's step, in plain PyTorch.

The update is torch.optim.AdamW's (decoupled weight decay, bias correction, eps outside the square root), in
float32, from moments that are stored in 8 bits between steps:

    p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr / (1 - beta1^t) * (m / (sqrt(v) / sqrt(1 - beta2^t) + eps))

Each step dequantizes the stored moments, updates them in float32, takes the parameter step from the float32
values, and requantizes. The flattened tensor is cut into blocks of `BLOCK` (256) elements, each with a float32
scale, so one outlier only coarsens its own block (2 bytes per parameter plus 8 bytes per block).

Quantization, and why:
  - m is signed: int8 codes in [-127, 127] with the block's absmax, companded by a square root:
    code = round(127 * sign(m) * sqrt(|m| / absmax)), m = absmax * q * |q| with q = code / 127. A gradient block
    spans orders of magnitude. A linear int8 code errs by up to absmax / 254 everywhere: 3.9% of a 1-sigma
    element in a block whose absmax is 10 sigma, 39% at 0.1 sigma, and zero below absmax / 254. The square
    root errs by about 1/|code| of the value (at most 2/(2|code| - 1) + 1/(2|code| - 1)^2): 2.5% at 1 sigma,
    8% at 0.1 sigma, zero only below absmax / 64516, for 0.8% instead of 0.4% at the top.
  - v is stored as sqrt(v), the quantity the update divides by (the root halves v's range of exponents), again
    companded by a square root: code = round(256 * sqrt(r)) - 1 with r = sqrt(v) / block max,
    clamped to [0, 255], and sqrt(v) = max * ((code + 1) / 256)^2. The map excludes zero: the smallest code
    means max / 65536, never 0. A second moment rounded to zero is what makes 8-bit Adam diverge (the update
    m / (sqrt(v) + eps) explodes for an element whose m survived; Li et al. 2023, "Memory Efficient Optimizers
    with 4-bit States", the "zero-point problem"); here a tiny v can only be overestimated, which shrinks that
    element's step. The block's largest element is stored exactly (code 255 is the scale itself).
  - Rounding is to nearest (floor(x + 0.5)) and square roots are correctly rounded (`sqrt_rn`), so the Triton
    kernel reproduces the same codes.
These are the same ideas as bitsandbytes' blockwise dynamic quantization (a nonlinear map, per-block absmax)
in a closed form, so a fused kernel needs no codebook search. On a small MLP regression over inputs of mixed
scales (400 steps, 3 seeds, beta2 0.95 and 0.999), the final weights sat 0.14-0.19 of AdamW's displacement
away from AdamW's; a linear int8 m gave 0.3-0.56, a linear sqrt(v) with zero 0.9-2.2, and a linear v with zero
diverged (losses 1e4-1e10 times AdamW's).

Tensors smaller than the optimizer's threshold (4096 elements by default, as bitsandbytes) keep float32 m and v:
then `Moments.first_scales` is None and the same update runs without the codes.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdraft.core.errors import SpecdraftError

BLOCK = 256
FIRST_LEVELS = 127.0  # int8 magnitudes 0..127 for m
SECOND_LEVELS = 256.0  # uint8 codes 0..255 mean (code + 1) / 256 of the block's max sqrt(v)
# Steps between levels, multiplied (rounded to float32: 1/127 is inexact) rather than divided: a kernel pays
# for an IEEE division per element, and dividing by the block's scale is one reciprocal per block.
FIRST_STEP = 1.0 / FIRST_LEVELS
SECOND_STEP = 1.0 / SECOND_LEVELS


class Moments(NamedTuple):
    """One tensor's Adam moments. Quantized: first int8 codes [N], second uint8 codes of sqrt(v) [N],
    first_scales (absmax of m) and second_scales (max of sqrt(v)) float32 [ceil(N / BLOCK)].
    Plain: first m and second v float32 [N], both scales None."""
    first: torch.Tensor
    second: torch.Tensor
    first_scales: torch.Tensor | None = None
    second_scales: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.first_scales is not None


@dataclass(frozen=True)
class StepScalars:
    """One step's hyperparameters; `step` counts from 1 (the step being taken)."""
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    step: int


def bias_corrections(step: int, beta1: float, beta2: float) -> tuple[float, float]:
    """(1 - beta1^t, 1 - beta2^t): undo the moments' zero initialisation."""
    return 1.0 - beta1 ** step, 1.0 - beta2 ** step


def update_coefficients(scalars: StepScalars) -> tuple[float, float, float]:
    """(decay, step_size, inverse_bias2_sqrt):
    p = p * decay - step_size * m / (sqrt(v) * inverse_bias2_sqrt + eps)."""
    correction1, correction2 = bias_corrections(scalars.step, scalars.beta1, scalars.beta2)
    return 1.0 - scalars.lr * scalars.weight_decay, scalars.lr / correction1, correction2 ** -0.5


def num_blocks(numel: int) -> int:
    return -(-numel // BLOCK)


def as_blocks(flat: torch.Tensor) -> torch.Tensor:
    """[N] -> [NB, BLOCK], the tail padded with zeros (which change no absmax)."""
    padded = torch.zeros(num_blocks(flat.numel()) * BLOCK, dtype=flat.dtype, device=flat.device)
    padded[:flat.numel()] = flat
    return padded.view(-1, BLOCK)


def sqrt_rn(values: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root (as CUDA's sqrtf and Triton's sqrt_rn). PyTorch's CPU
    float32 sqrt is off by one ulp on some inputs (torch 2.13); through float64 it is exact, as a float64 root
    carries more than twice float32's precision, so the second rounding cannot move it."""
    return values.double().sqrt().float()


def _ratio(magnitude: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """magnitude [NB, BLOCK] times 1 / scales [NB] (one reciprocal per block); an all-zero block (scale 0)
    multiplies by 1."""
    scale = scales[:, None]  # [NB, 1]
    return magnitude * (torch.ones_like(scale) / torch.where(scale > 0, scale, torch.ones_like(scale)))


def dequantize_first(codes: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """int8 codes [N], absmax [NB] -> m [NB, BLOCK] float32 (padded)."""
    level = as_blocks(codes).float() * FIRST_STEP  # [NB, BLOCK] in [-1, 1]
    return level * level.abs() * absmax[:, None]


def quantize_first(first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """m [NB, BLOCK] float32 -> (int8 codes [NB, BLOCK], absmax [NB])."""
    absmax = first.abs().amax(1)  # [NB]
    magnitude = torch.floor(sqrt_rn(_ratio(first.abs(), absmax)) * FIRST_LEVELS + 0.5)
    return torch.where(first < 0, -magnitude, magnitude).to(torch.int8), absmax


def dequantize_second_root(codes: torch.Tensor, root_max: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N], max sqrt(v) [NB] -> sqrt(v) [NB, BLOCK] float32 (padded)."""
    level = (as_blocks(codes).float() + 1.0) * SECOND_STEP  # [NB, BLOCK] in [1/256, 1]
    return level * level * root_max[:, None]


def quantize_second_root(root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sqrt(v) [NB, BLOCK] float32 -> (uint8 codes [NB, BLOCK], max [NB])."""
    root_max = root.amax(1)  # [NB]
    code = torch.floor(sqrt_rn(_ratio(root, root_max)) * SECOND_LEVELS + 0.5) - 1.0
    return code.clamp(0.0, 255.0).to(torch.uint8), root_max


def check_inputs(param: torch.Tensor, grad: torch.Tensor, moments: Moments) -> None:
    """Raises SpecdraftError unless param is contiguous float32 and grad and moments fit it."""
    if param.dtype != torch.float32 or not param.is_contiguous():
        raise SpecdraftError(f"adamw8bit: the param must be contiguous float32, got {param.dtype} "
                             f"{tuple(param.shape)} (contiguous: {param.is_contiguous()})")
    if grad.shape != param.shape or not grad.is_floating_point() or grad.is_sparse:
        raise SpecdraftError(f"adamw8bit: the gradient {grad.dtype} {tuple(grad.shape)} does not match the param "
                             f"{tuple(param.shape)} (dense floating point)")
    expected = (torch.int8, torch.uint8) if moments.quantized else (torch.float32, torch.float32)
    if (moments.first.dtype, moments.second.dtype) != expected or moments.first.numel() != param.numel():
        raise SpecdraftError(f"adamw8bit: moments {moments.first.dtype}/{moments.second.dtype} "
                             f"[{moments.first.numel()}] do not fit the param {tuple(param.shape)}")


def adam_update(param, grad, first, second, scalars: StepScalars):
    """float32 param, grad, m, v (same shapes) -> (param, m, v, sqrt(v)) after one AdamW step."""
    decay, step_size, inverse_bias2_sqrt = update_coefficients(scalars)
    first = scalars.beta1 * first + (1.0 - scalars.beta1) * grad
    second = scalars.beta2 * second + (1.0 - scalars.beta2) * (grad * grad)
    root = sqrt_rn(second)
    denominator = root * inverse_bias2_sqrt + scalars.eps
    return param * decay - step_size * (first / denominator), first, second, root


def adamw8bit_step_reference(param: torch.Tensor, grad: torch.Tensor, moments: Moments,
                             scalars: StepScalars) -> None:
    """param [...] float32 (updated in place), grad [...]; moments (updated in place) -> None."""
    check_inputs(param, grad, moments)
    if not moments.quantized:
        new_param, first, second, _ = adam_update(param.view(-1), grad.reshape(-1).float(), moments.first,
                                                  moments.second, scalars)
        param.view(-1).copy_(new_param)
        moments.first.copy_(first)
        moments.second.copy_(second)
        return
    numel = param.numel()
    first = dequantize_first(moments.first, moments.first_scales)  # [NB, BLOCK]
    root = dequantize_second_root(moments.second, moments.second_scales)  # [NB, BLOCK]
    new_param, first, _, root = adam_update(as_blocks(param.reshape(-1)), as_blocks(grad.reshape(-1).float()), first,
                                            root * root, scalars)
    param.copy_(new_param.reshape(-1)[:numel].view_as(param))
    first_codes, first_scales = quantize_first(first)
    root_codes, root_scales = quantize_second_root(root)
    moments.first.copy_(first_codes.reshape(-1)[:numel])
    moments.second.copy_(root_codes.reshape(-1)[:numel])
    moments.first_scales.copy_(first_scales)
    moments.second_scales.copy_(root_scales)
