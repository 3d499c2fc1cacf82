"""`quant_linear`: y = x W^T + b with W held in 8 bits (per-channel int8) or 4 bits (group-wise int4, two a byte),
the weight-only quantized target's linear layers (reference.py: the format and the spec).

Dispatch: the Triton kernel when `use_triton(x)` (dequantization inside the matmul's loop: a decode step reads a
half or a quarter of bf16's bytes), else the reference (dequantize, then F.linear); tests/kernels/
test_quant_linear.py compares both with a float64 formula. CUDA-graph capturable: static shapes, no host sync.
"""
from typing import Optional

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.quant_linear.reference import (GROUP_SIZE, QuantizedWeight, dequantize, quant_linear_reference,
                                                      quantize)


def quant_linear(x: torch.Tensor, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., I] (float32, bfloat16 or float16) -> [..., O] in x's dtype."""
    if use_triton(x, "quant_linear"):
        from specdraft.kernels.quant_linear.triton_kernel import quant_linear_triton

        return quant_linear_triton(x, weight, bias)
    return quant_linear_reference(x, weight, bias)


__all__ = ["GROUP_SIZE", "QuantizedWeight", "dequantize", "quant_linear", "quant_linear_reference", "quantize"]
