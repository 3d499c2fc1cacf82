"""Weight-only quantized linear layers (8 bits per channel, 4 bits per group: `kernels.quant_linear`), and the
quantization of a Hugging Face Llama-family model in place: every decoder layer's linear layers and the LM head
(the token embedding stays as it is: a decode step reads one of its rows). This is the weight-only quantized target
of `target.quantization=int8|int4`, the one model that distillation, training features, evaluation and the
runtime all run: its dequantized weights are the same bits on every path (kernels/quant_linear/reference.py).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.quant_linear import GROUP_SIZE, QuantizedWeight, dequantize, quant_linear, quantize

WEIGHT_ONLY: Dict[str, int] = {"int8": 8, "int4": 4}
"""target.quantization settings that quantize the target's weights for every stage, and their bits."""


class QuantizedLinear(nn.Module):
    """nn.Linear's interface over a weight in 8 or 4 bits. The codes and the scales' float bits are integer buffers
    (int8/uint8 codes, int32 or int16 views of the float32/float16 scales), so that a model's `.to(dtype)` casts
    its float parameters (the bias) and leaves the format alone; `weight` dequantizes it in the dtype the module
    was last cast to."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, bits: int = 4,
                 group_size: int = GROUP_SIZE, device=None, dtype=None):
        super().__init__()
        if bits not in (8, 4):
            raise SpecdraftError(f"QuantizedLinear takes 8 or 4 bits, got {bits}")
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.group_size = in_features if bits == 8 else group_size
        groups = -(-in_features // self.group_size)
        if bits == 8:
            self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
            self.register_buffer("scale_bits", torch.zeros(out_features, dtype=torch.int32, device=device))
            self.register_buffer("min_bits", None)
        else:
            packed = -(-in_features // 2)
            self.register_buffer("codes", torch.zeros(out_features, packed, dtype=torch.uint8, device=device))
            self.register_buffer("scale_bits", torch.zeros(out_features, groups, dtype=torch.int16, device=device))
            self.register_buffer("min_bits", torch.zeros(out_features, groups, dtype=torch.int16, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        probe = torch.zeros(0, device=device, dtype=dtype or torch.get_default_dtype())
        self.register_buffer("dtype_probe", probe, persistent=False)  # follows .to(dtype): `weight`'s dtype

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"bits={self.bits}, group_size={self.group_size}")

    def quantized(self) -> QuantizedWeight:
        """The weight as the kernels take it (views of the buffers, no copy)."""
        scale_dtype = torch.float32 if self.bits == 8 else torch.float16
        mins = None if self.min_bits is None else self.min_bits.view(torch.float16)
        return QuantizedWeight(self.bits, self.codes, self.scale_bits.view(scale_dtype), mins, self.in_features,
                               self.group_size)

    def load_quantized(self, weight: QuantizedWeight, bias: Optional[torch.Tensor] = None) -> "QuantizedLinear":
        """Copies a QuantizedWeight of this module's shape and format (and a bias, when given) in; returns self."""
        if (weight.bits, weight.out_features, weight.in_features, weight.group_size) != \
                (self.bits, self.out_features, self.in_features, self.group_size):
            raise SpecdraftError(f"a {weight.bits}-bit [{weight.out_features}, {weight.in_features}] weight (groups "
                                 f"of {weight.group_size}) does not fit {self.extra_repr()}")
        self.codes.copy_(weight.data)
        self.scale_bits.copy_(weight.scales.view(self.scale_bits.dtype))
        if self.min_bits is not None:
            self.min_bits.copy_(weight.mins.view(torch.int16))
        if self.bias is not None and bias is not None:
            self.bias.data.copy_(bias)
        return self

    @property
    def weight(self) -> torch.Tensor:
        """[O, I] dequantized, in the module's dtype (a new tensor each call: read it once)."""
        return dequantize(self.quantized(), self.dtype_probe.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., I] -> [..., O]
        return quant_linear(x, self.quantized(), self.bias)


@torch.no_grad()
def quantized_linear(weight: torch.Tensor, bias: Optional[torch.Tensor], bits: int,
                     group_size: int = GROUP_SIZE) -> QuantizedLinear:
    """weight [O, I] (and bias [O]) -> a QuantizedLinear holding them quantized, on their device and in their dtype.
    The codes come from the weight rounded to bfloat16, so that a target loaded in float32 (the CPU, a float32
    check) and one loaded in bfloat16 (a GPU) are quantized to the same codes and scales."""
    module = QuantizedLinear(weight.shape[1], weight.shape[0], bias is not None, bits, group_size, weight.device,
                             weight.dtype)
    return module.load_quantized(quantize(weight.to(torch.bfloat16), bits, group_size), bias)


def fake_quantized(weight: torch.Tensor, setting: str) -> torch.Tensor:
    """weight [O, I] -> the weight a `quantize_decoder` of `setting` computes with, dequantized, in its dtype."""
    return quantized_linear(weight, None, WEIGHT_ONLY[setting]).weight


@torch.no_grad()
def stacked_rows(*modules: QuantizedLinear) -> QuantizedWeight:
    """Quantized linear layers over the same input -> one weight holding their output rows in order (q, k and v
    fused, say): quantization is per row, so the stack is what quantizing the stacked float weights gives."""
    parts = [module.quantized() for module in modules]
    first = parts[0]
    if any((p.bits, p.in_features, p.group_size) != (first.bits, first.in_features, first.group_size) for p in parts):
        raise SpecdraftError("stacked_rows: the layers differ in bits, input width or group size")
    mins = None if first.mins is None else torch.cat([p.mins for p in parts])
    return first._replace(data=torch.cat([p.data for p in parts]), scales=torch.cat([p.scales for p in parts]),
                          mins=mins)


@torch.no_grad()
def quantize_decoder(model: nn.Module, setting: str) -> nn.Module:
    """A Hugging Face causal LM with every linear layer of its decoder layers and its LM head replaced, in place,
    by a QuantizedLinear of `setting` (a WEIGHT_ONLY key); each float weight is freed as its layer is replaced."""
    bits = WEIGHT_ONLY[setting]
    for layer in model.get_decoder().layers:
        for name, child in list(layer.named_modules()):
            if type(child) is nn.Linear:
                parent_name, _, attribute = name.rpartition(".")
                parent = layer.get_submodule(parent_name) if parent_name else layer
                setattr(parent, attribute, quantized_linear(child.weight, child.bias, bits))
    head = model.get_output_embeddings()
    if type(head) is nn.Linear:
        model.set_output_embeddings(quantized_linear(head.weight, head.bias, bits))
    return model


def weight_only_bits(model: nn.Module) -> Optional[int]:
    """The bits of a model quantized by `quantize_decoder` (read from its LM head), or None."""
    head = model.get_output_embeddings()
    return head.bits if isinstance(head, QuantizedLinear) else None
