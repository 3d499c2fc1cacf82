"""The verifier from a Hugging Face causal LM: its family (families/, by model type) describes it and maps its
weights into `VerifierModel`'s fused ones (q/k/v stacked by rows into one matmul, gate/up into another, experts in
Hugging Face's own [E, 2I, H] / [E, H, I] layout). A weight-only quantized Hugging Face model (target.quantization
int8|int4, layers/quantized.py) gives a quantized verifier: the same codes, fused by stacking their rows, its
matmuls `kernels.quant_linear` (in the CUDA graphs too); dense targets only. `quantized_verifier` quantizes a float
one; `hf_rope_tables` reads the HF model's own rotary tables (one per rotary kind the family's layers use).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.layers.quantized import WEIGHT_ONLY, quantized_linear, weight_only_bits
from specdraft.decoding.verifier.architecture import Architecture
from specdraft.decoding.verifier.families import FAMILIES, SUPPORTED, UnsupportedTarget, family_for, unknown_family
from specdraft.decoding.verifier.model import VerifierModel

__all__ = ["SUPPORTED", "architecture_of", "from_hf", "hf_rope_tables", "quantized_verifier", "unsupported_reason"]


def architecture_of(hf_model, info: TargetInfo) -> Architecture:
    """The family's description of a Hugging Face causal LM; a one-line SpecdraftError naming what it cannot run."""
    try:
        architecture = family_for(info.model_type).describe(hf_model)
    except UnsupportedTarget as error:
        raise SpecdraftError(f"the runtime cannot run target {info.name_or_path} ({info.model_type}): "
                             f"{error.reason}") from None
    bits = weight_only_bits(hf_model)
    if bits is not None and architecture.has_experts:
        raise SpecdraftError(f"target {info.name_or_path} ({info.model_type}) is a mixture-of-experts model: the "
                             f"runtime's weight-only quantization ({bits}-bit) runs dense targets alone; use "
                             "quantization none")
    return architecture


def unsupported_reason(hf_model, info: TargetInfo) -> Optional[str]:
    """Why the verifier would not compute what this Hugging Face causal LM computes, in a few words; None when
    it does."""
    if info.model_type not in FAMILIES:
        return f"model type {info.model_type!r} ({unknown_family(info.model_type)})"
    try:
        architecture = FAMILIES[info.model_type].describe(hf_model)
    except UnsupportedTarget as error:
        return error.reason
    if architecture.has_experts and weight_only_bits(hf_model) is not None:
        return "weight-only quantized mixture-of-experts weights"
    return None


@torch.no_grad()
def from_hf(hf_model, info: TargetInfo) -> VerifierModel:
    """A VerifierModel with the weights of a Hugging Face causal LM of a known family (same device and dtype;
    quantized when its linear layers are, layers/quantized.py)."""
    architecture = architecture_of(hf_model, info)
    weight = hf_model.get_input_embeddings().weight
    with torch.device(weight.device):
        model = VerifierModel(info, bits=weight_only_bits(hf_model), architecture=architecture).to(weight.dtype)
    family_for(info.model_type).load(hf_model, model)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def quantized_verifier(model: VerifierModel, setting: str) -> VerifierModel:
    """A float VerifierModel -> a new one with its linear layers and LM head quantized to `setting` (int8, int4),
    as `quantize_decoder` quantizes a Hugging Face model (q, k, v quantized together: rows are independent); the
    embedding, norms and buffers are copies. Built on the meta device, so no float copy of the weights is ever
    made. Dense targets only."""
    if model.architecture.has_experts:
        raise SpecdraftError(f"the runtime's weight-only quantization ({setting}) runs dense targets alone; "
                             f"{model.info.name_or_path} is a mixture-of-experts model")
    with torch.device("meta"):
        quantized = VerifierModel(model.info, bits=WEIGHT_ONLY[setting], architecture=model.architecture)
    linear = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    for name, module in model.named_modules():
        if name in linear:
            parent_name, _, attribute = name.rpartition(".")
            parent = quantized.get_submodule(parent_name) if parent_name else quantized
            setattr(parent, attribute, quantized_linear(module.weight, module.bias, WEIGHT_ONLY[setting]))
    for name, param in model.named_parameters():  # the embedding and the norms
        owner_name, _, attribute = name.rpartition(".")
        if owner_name not in linear:
            setattr(quantized.get_submodule(owner_name) if owner_name else quantized, attribute,
                    nn.Parameter(param.clone(), requires_grad=False))
    for name, buffer in model.named_buffers():
        owner_name, _, attribute = name.rpartition(".")
        owner = quantized.get_submodule(owner_name) if owner_name else quantized
        owner.register_buffer(attribute, buffer.clone(), persistent=False)
    return quantized.eval().requires_grad_(False)


@torch.no_grad()
def hf_rope_tables(hf_model, max_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, D] from the HF model's own rotary embedding (its rope scaling included); [R, max_len, D]
    for a family whose layers use R rotary kinds (Gemma 3's global and local bases)."""
    decoder = hf_model.get_decoder()
    weight = hf_model.get_input_embeddings().weight
    positions = torch.arange(max_len, device=weight.device)[None]
    probe = torch.zeros(1, max_len, 1, device=weight.device, dtype=torch.float32)
    kinds = family_for(hf_model.config.get_text_config().model_type).describe(hf_model).rope_kinds
    tables = [decoder.rotary_emb(probe, positions) if kind is None else decoder.rotary_emb(probe, positions, kind)
              for kind in kinds]
    if len(tables) == 1:
        return tables[0][0][0], tables[0][1][0]
    return torch.stack([cos[0] for cos, _ in tables]), torch.stack([sin[0] for _, sin in tables])
