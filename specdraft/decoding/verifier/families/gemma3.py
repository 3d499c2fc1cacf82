"""Gemma 3 (its language model, gemma3_text): every RMSNorm scales by 1 + w with the product in float32; norms
before and after both the attention and the MLP (input, post_attention, pre_feedforward, post_feedforward); q and k
normed per head; a GeGLU MLP (GeLU's tanh form); embeddings scaled by sqrt(H); the query scaled by
query_pre_attn_scalar^-1/2; local (sliding-window) and global layers as layer_types interleave them (5:1 in the
released models), each kind with its own rotary base (rope_parameters per layer type: the local layers'
rope_local_base_freq). Gemma 3 drops Gemma 2's attention-logit softcapping (a config that sets
attn_logit_softcapping is refused); the final-logit softcap is honoured where the config sets one."""
from torch import nn

from specdraft.decoding.verifier.architecture import Architecture, LayerKind, Norm
from specdraft.decoding.verifier.families.base import (Family, LAYER_TYPES, UnsupportedTarget, activation,
                                                       check_no_biases, layer_windows, load_attention,
                                                       load_dense_mlp, load_norm, load_outer, qkv_bias,
                                                       text_config)
from specdraft.decoding.verifier.model import VerifierModel


def describe(hf_model: nn.Module) -> Architecture:
    config, decoder = text_config(hf_model), hf_model.get_decoder()
    if config.attn_logit_softcapping is not None:
        raise UnsupportedTarget(f"attention logit softcapping ({config.attn_logit_softcapping})")
    if config.use_bidirectional_attention:
        raise UnsupportedTarget("bidirectional attention")
    check_no_biases(decoder)
    windows = layer_windows(config)
    rope_kinds = tuple(kind for kind in LAYER_TYPES if kind in config.layer_types)  # a table per kind present
    kinds = tuple(LayerKind(config.intermediate_size, sliding_window=window, rope=rope_kinds.index(kind))
                  for window, kind in zip(windows, config.layer_types))
    return Architecture(layers=kinds, qkv_bias=qkv_bias(decoder), qk_norm=True,
                        norm=Norm(offset=1.0, weight_in_fp32=True), sandwich_norms=True,
                        activation=activation(config.hidden_activation), embed_scale=config.hidden_size ** 0.5,
                        attention_scale=config.query_pre_attn_scalar ** -0.5,
                        final_logit_softcap=config.final_logit_softcapping, rope_kinds=rope_kinds)


def load(hf_model: nn.Module, model: VerifierModel) -> None:
    load_outer(hf_model, model)
    norm = model.architecture.norm
    for layer, hf_layer in zip(model.layers, hf_model.get_decoder().layers):
        load_attention(layer, hf_layer.self_attn, model.architecture)
        load_norm(layer, "attn_norm", hf_layer.input_layernorm.weight, norm)
        load_norm(layer, "post_attn_norm", hf_layer.post_attention_layernorm.weight, norm)
        load_norm(layer, "mlp_norm", hf_layer.pre_feedforward_layernorm.weight, norm)
        load_norm(layer, "post_mlp_norm", hf_layer.post_feedforward_layernorm.weight, norm)
        load_dense_mlp(layer, hf_layer.mlp)


FAMILY = Family("gemma3", ("gemma3_text",), describe, load)
