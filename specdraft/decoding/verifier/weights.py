"""The Hugging Face weight map of the verifier: which tensors of a Llama-family causal LM (the families in
`SUPPORTED`, and the language models of vision-language targets built on them) fill which of `VerifierModel`'s
fused weights (q/k/v stacked by rows into one matmul, gate/up into another). A weight-only quantized Hugging Face
model (target.quantization int8|int4, layers/quantized.py) gives a quantized verifier: the same codes, fused by
stacking their rows, its matmuls `kernels.quant_linear` (in the CUDA graphs too). `quantized_verifier` quantizes a
float one; `hf_rope_tables` reads the HF model's own rotary tables.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.layers.quantized import WEIGHT_ONLY, QuantizedLinear, quantized_linear, stacked_rows, weight_only_bits
from specdraft.decoding.verifier.model import VerifierModel

SUPPORTED = ("llama", "qwen2", "mistral", "qwen2_vl_text", "qwen2_5_vl_text")


def _copy(dst: nn.Module | nn.Parameter, *sources: nn.Module | torch.Tensor) -> None:
    """Weights of Hugging Face linear layers (stacked by rows: q, k, v fused) or one tensor into dst."""
    if isinstance(dst, QuantizedLinear):
        dst.load_quantized(stacked_rows(*sources))
        return
    weights = [source.weight if isinstance(source, nn.Module) else source for source in sources]
    target = dst.weight if isinstance(dst, nn.Module) else dst
    target.data.copy_(torch.cat(weights, dim=0) if len(weights) > 1 else weights[0])


@torch.no_grad()
def from_hf(hf_model, info: TargetInfo) -> VerifierModel:
    """A VerifierModel with the weights of a Hugging Face Llama-family causal LM (same device and dtype; quantized
    when its linear layers are, layers/quantized.py)."""
    if info.model_type not in SUPPORTED:
        raise SpecdraftError(f"the runtime runs Llama-family targets {SUPPORTED}; this target is {info.model_type!r}")
    decoder = hf_model.get_decoder()
    first_attn = decoder.layers[0].self_attn
    qkv_bias = first_attn.q_proj.bias is not None
    weight = hf_model.get_input_embeddings().weight
    with torch.device(weight.device):
        model = VerifierModel(info, qkv_bias, weight_only_bits(hf_model)).to(weight.dtype)
    model.embed_tokens.weight.copy_(weight)
    _copy(model.lm_head, hf_model.get_output_embeddings())
    model.norm.copy_(decoder.norm.weight)
    for layer, hf_layer in zip(model.layers, decoder.layers):
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        _copy(layer.wqkv, attn.q_proj, attn.k_proj, attn.v_proj)
        if qkv_bias:
            layer.wqkv.bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        _copy(layer.wo, attn.o_proj)
        _copy(layer.w13, mlp.gate_proj, mlp.up_proj)
        _copy(layer.w2, mlp.down_proj)
        _copy(layer.attn_norm, hf_layer.input_layernorm.weight)
        _copy(layer.mlp_norm, hf_layer.post_attention_layernorm.weight)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def quantized_verifier(model: VerifierModel, setting: str) -> VerifierModel:
    """A float VerifierModel -> a new one with its linear layers and LM head quantized to `setting` (int8, int4),
    as `quantize_decoder` quantizes a Hugging Face model (q, k, v quantized together: rows are independent); the
    embedding and norms are copies. Built on the meta device, so no float copy of the weights is ever made."""
    with torch.device("meta"):
        quantized = VerifierModel(model.info, model.layers[0].wqkv.bias is not None, WEIGHT_ONLY[setting])
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            parent_name, _, attribute = name.rpartition(".")
            parent = quantized.get_submodule(parent_name) if parent_name else quantized
            setattr(parent, attribute, quantized_linear(module.weight, module.bias, WEIGHT_ONLY[setting]))
    quantized.embed_tokens.weight = nn.Parameter(model.embed_tokens.weight.clone())
    quantized.norm = nn.Parameter(model.norm.clone())
    for layer, source in zip(quantized.layers, model.layers):
        layer.attn_norm, layer.mlp_norm = nn.Parameter(source.attn_norm.clone()), nn.Parameter(source.mlp_norm.clone())
    return quantized.eval().requires_grad_(False)


@torch.no_grad()
def hf_rope_tables(hf_model, max_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, D] from the HF model's own rotary embedding (its rope scaling included)."""
    decoder = hf_model.get_decoder()
    weight = hf_model.get_input_embeddings().weight
    positions = torch.arange(max_len, device=weight.device)[None]
    probe = torch.zeros(1, max_len, 1, device=weight.device, dtype=torch.float32)
    cos, sin = decoder.rotary_emb(probe, positions)
    return cos[0], sin[0]
