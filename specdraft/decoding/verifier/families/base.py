"""What every family file builds on: `Family` (a description and a weight map, keyed by Hugging Face model types),
`UnsupportedTarget` (what a description cannot reproduce, in a few words), and the pieces of a weight map that
families share: the embedding, the LM head and the final norm; a layer's attention (q/k/v stacked by rows into one
matmul, their norms); a dense gated MLP (gate/up stacked); routed experts; a norm with its family's offset folded in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.layers.quantized import QuantizedLinear, stacked_rows
from specdraft.decoding.verifier.architecture import ACTIVATIONS, Architecture, Norm
from specdraft.decoding.verifier.layer import DecoderLayer, RoutedExperts
from specdraft.decoding.verifier.model import VerifierModel

HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
"""Hugging Face's activation names -> the verifier's (architecture.ACTIVATIONS)."""
LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedTarget(SpecdraftError):
    """A target whose family is known but whose config asks for what the verifier does not compute."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Family:
    """A target family as the verifier runs it: `describe` reads a Hugging Face causal LM's config (and modules) into
    an Architecture, or raises UnsupportedTarget; `load` copies its weights into a VerifierModel of that
    architecture (same device and dtype)."""

    name: str
    model_types: Tuple[str, ...]
    describe: Callable[[nn.Module], Architecture]
    load: Callable[[nn.Module, VerifierModel], None]


def text_config(hf_model: nn.Module):
    """The config of the language model (a vision-language target's text part)."""
    return hf_model.config.get_text_config()


def activation(name: str) -> str:
    """A Hugging Face activation name -> the verifier's, or UnsupportedTarget."""
    if name not in HF_ACTIVATIONS:
        raise UnsupportedTarget(f"activation {name!r} (it runs {', '.join(sorted(HF_ACTIVATIONS))})")
    assert HF_ACTIVATIONS[name] in ACTIVATIONS
    return HF_ACTIVATIONS[name]


def layer_windows(config) -> Tuple[Optional[int], ...]:
    """Each layer's sliding window from a config: by `layer_types` where the config lists them (Qwen2/3, Gemma 3),
    else the config's sliding_window on every layer (Mistral, Mixtral, Qwen3-MoE; None or 0: none)."""
    window = getattr(config, "sliding_window", None) or None
    types = getattr(config, "layer_types", None)
    if types is None:
        return (window,) * config.num_hidden_layers
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise UnsupportedTarget(f"layer types {', '.join(unknown)} (it runs {', '.join(LAYER_TYPES)})")
    return tuple(window if kind == "sliding_attention" else None for kind in types)


def check_no_biases(decoder: nn.Module, mlp_names: Tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")) -> None:
    """UnsupportedTarget when the o projection or a dense MLP's projections carry biases (the verifier's have none)."""
    layer = decoder.layers[0]
    mlp = layer.mlp
    if layer.self_attn.o_proj.bias is not None or any(
            isinstance(getattr(mlp, name, None), nn.Linear) and getattr(mlp, name).bias is not None
            for name in mlp_names):
        raise UnsupportedTarget("biases on o_proj or the MLP")


def qkv_bias(decoder: nn.Module) -> bool:
    return decoder.layers[0].self_attn.q_proj.bias is not None


def copy_into(dst: nn.Module | nn.Parameter, *sources: nn.Module | torch.Tensor) -> None:
    """Weights of Hugging Face linear layers (stacked by rows: q, k, v fused) or one tensor into dst; quantized
    layers' codes stacked as they are."""
    if isinstance(dst, QuantizedLinear):
        dst.load_quantized(stacked_rows(*sources))
        return
    weights = [source.weight if isinstance(source, nn.Module) else source for source in sources]
    target = dst.weight if isinstance(dst, nn.Module) else dst
    target.data.copy_(torch.cat(weights, dim=0) if len(weights) > 1 else weights[0])


def load_norm(owner: nn.Module, name: str, weight: torch.Tensor, norm: Norm) -> None:
    """owner.name <- the norm weight with the family's offset folded in (float32 where the product is taken in
    float32, so that nothing is rounded before the norm rounds once)."""
    dtype = torch.float32 if norm.weight_in_fp32 else getattr(owner, name).dtype
    folded = weight.detach().to(dtype) + norm.offset if norm.offset else weight.detach().to(dtype)
    setattr(owner, name, nn.Parameter(folded.clone(), requires_grad=False))


def load_outer(hf_model: nn.Module, model: VerifierModel) -> None:
    """The embedding, the LM head and the final norm."""
    model.embed_tokens.weight.data.copy_(hf_model.get_input_embeddings().weight)
    copy_into(model.lm_head, hf_model.get_output_embeddings())
    load_norm(model, "norm", hf_model.get_decoder().norm.weight, model.architecture.norm)


def load_attention(layer: DecoderLayer, attention: nn.Module, architecture: Architecture) -> None:
    """q/k/v stacked into wqkv (their biases too), o into wo, the q/k norms where the family has them."""
    copy_into(layer.wqkv, attention.q_proj, attention.k_proj, attention.v_proj)
    if architecture.qkv_bias:
        layer.wqkv.bias.data.copy_(torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias]))
    copy_into(layer.wo, attention.o_proj)
    if architecture.qk_norm:
        load_norm(layer, "q_norm", attention.q_norm.weight, architecture.norm)
        load_norm(layer, "k_norm", attention.k_norm.weight, architecture.norm)


def load_dense_mlp(layer: DecoderLayer, mlp: nn.Module) -> None:
    """gate/up stacked into w13, down into w2."""
    copy_into(layer.w13, mlp.gate_proj, mlp.up_proj)
    copy_into(layer.w2, mlp.down_proj)


def load_experts(experts: RoutedExperts, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> None:
    """The router [E, H] and the experts' gate_up [E, 2I, H] and down [E, H, I] (Hugging Face's fused layout)."""
    experts.router.data.copy_(router)
    experts.gate_up.data.copy_(gate_up)
    experts.down.data.copy_(down)


def load_pre_norm_layers(hf_model: nn.Module, model: VerifierModel,
                         load_mlp: Callable[[DecoderLayer, nn.Module], None] = load_dense_mlp) -> None:
    """The Llama layout's weight map (input_layernorm, self_attn, post_attention_layernorm, mlp per layer, each
    MLP by `load_mlp`), with the embedding, head and final norm."""
    load_outer(hf_model, model)
    norm = model.architecture.norm
    for layer, hf_layer in zip(model.layers, hf_model.get_decoder().layers):
        load_attention(layer, hf_layer.self_attn, model.architecture)
        load_norm(layer, "attn_norm", hf_layer.input_layernorm.weight, norm)
        load_norm(layer, "mlp_norm", hf_layer.post_attention_layernorm.weight, norm)
        load_mlp(layer, hf_layer.mlp)
