"""Weight-only quantized linear layers, the spec: the format of the quantized weights, and y = x W^T + b with W
dequantized first (then one matmul in the activations' dtype).

int8 (8-bit): per output channel, symmetric: s = max|w_row| / 127 (float32), q = round(w / s) in [-127, 127];
    w ~ q * s.
int4 (4-bit): per group of `group_size` consecutive input columns of a row, asymmetric: s = (max - min) / 15 and
    m = min (both float16), q = round((w - m) / s) in [0, 15]; w ~ q * s + m. Packed two per byte along the
    input dimension: byte j of a row holds column 2j in its low nibble and column 2j + 1 in its high one. A row's
    last group may be shorter (SmolLM2's 576 input columns are four groups of 128 and one of 64).
Dequantization computes in float32 (the product, then for int4 the sum: each rounded, no fused multiply-add)
and rounds once to the activations' dtype: the weights every path multiplies, the Triton kernel's inner loop
included, so that the quantized target is one model whichever path runs it.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from specdraft.core.errors import SpecdraftError

GROUP_SIZE = 128
"""int4's input columns per scale and minimum."""
BITS = (8, 4)


class QuantizedWeight(NamedTuple):
    """A [out_features, in_features] weight in 8 or 4 bits (module docstring)."""

    bits: int
    data: torch.Tensor  # int8 [O, I] (8 bits) or uint8 [O, ceil(I / 2)] (4 bits, two columns a byte)
    scales: torch.Tensor  # float32 [O] (8 bits) or float16 [O, G] (4 bits, G = ceil(I / group_size))
    mins: Optional[torch.Tensor]  # float16 [O, G] (4 bits); None for 8 bits
    in_features: int
    group_size: int

    @property
    def out_features(self) -> int:
        return self.data.shape[0]


def quantize(weight: torch.Tensor, bits: int, group_size: int = GROUP_SIZE) -> QuantizedWeight:
    """weight [O, I] (any float dtype, any device) -> its QuantizedWeight on the same device."""
    if bits not in BITS:
        raise SpecdraftError(f"weight-only quantization takes 8 or 4 bits, got {bits}")
    if bits == 8:
        return _quantize_int8(weight.float())
    if group_size < 2 or group_size % 2:
        raise SpecdraftError(f"int4 groups must hold an even number of columns, got {group_size}")
    return _quantize_int4(weight.float(), group_size)


def _quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    scales = weight.abs().amax(dim=1) / 127  # [O]
    safe = torch.where(scales > 0, scales, 1.0)
    data = torch.round(weight / safe[:, None]).clamp(-127, 127).to(torch.int8)  # [O, I]
    return QuantizedWeight(8, data, scales, None, weight.shape[1], weight.shape[1])


def _quantize_int4(weight: torch.Tensor, group_size: int) -> QuantizedWeight:
    rows, columns = weight.shape
    groups = -(-columns // group_size)
    pad = groups * group_size - columns  # the short last group repeats its last column: same minimum and maximum
    grouped = torch.cat([weight, weight[:, -1:].expand(rows, pad)], dim=1).view(rows, groups, group_size)
    lowest, highest = grouped.amin(dim=-1), grouped.amax(dim=-1)  # [O, G]
    scales = ((highest - lowest) / 15).clamp(max=65504).to(torch.float16)
    mins = lowest.clamp(-65504, 65504).to(torch.float16)
    safe = torch.where(scales > 0, scales.float(), 1.0)
    codes = torch.round((grouped - mins.float()[..., None]) / safe[..., None]).clamp(0, 15).to(torch.uint8)
    codes = codes.view(rows, -1)[:, :columns]  # [O, I]
    if columns % 2:
        codes = F.pad(codes, (0, 1))
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # [O, ceil(I / 2)]
    return QuantizedWeight(4, packed.contiguous(), scales, mins, columns, group_size)


def unpack_int4(data: torch.Tensor, in_features: int) -> torch.Tensor:
    """uint8 [O, ceil(I / 2)] -> the codes [O, I] (uint8 in 0..15)."""
    return torch.stack([data & 0xF, data >> 4], dim=-1).view(data.shape[0], -1)[:, :in_features]


def dequantize(weight: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """-> [O, I] in `dtype`: computed in float32 and rounded once (module docstring)."""
    if weight.bits == 8:
        return (weight.data.float() * weight.scales[:, None]).to(dtype)
    codes = unpack_int4(weight.data, weight.in_features).float()  # [O, I]
    scales = weight.scales.float().repeat_interleave(weight.group_size, dim=1)[:, :weight.in_features]
    mins = weight.mins.float().repeat_interleave(weight.group_size, dim=1)[:, :weight.in_features]
    return (codes * scales + mins).to(dtype)


def quant_linear_reference(x: torch.Tensor, weight: QuantizedWeight,
                           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., I] -> [..., O] in x's dtype: F.linear with the dequantized weight."""
    return F.linear(x, dequantize(weight, x.dtype), None if bias is None else bias.to(x.dtype))
