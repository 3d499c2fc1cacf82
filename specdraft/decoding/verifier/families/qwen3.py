"""Qwen3 (dense): the Llama layout with an RMSNorm over each head's q and k before the rotation (q_norm, k_norm,
Llama's rounding), sliding-window layers where its layer_types say."""
from torch import nn

from specdraft.decoding.verifier.architecture import Architecture, LayerKind
from specdraft.decoding.verifier.families.base import (Family, activation, check_no_biases, layer_windows,
                                                       load_pre_norm_layers, qkv_bias, text_config)


def describe(hf_model: nn.Module) -> Architecture:
    config, decoder = text_config(hf_model), hf_model.get_decoder()
    check_no_biases(decoder)
    kinds = tuple(LayerKind(config.intermediate_size, sliding_window=window) for window in layer_windows(config))
    return Architecture(layers=kinds, qkv_bias=qkv_bias(decoder), qk_norm=True,
                        activation=activation(config.hidden_act))


FAMILY = Family("qwen3", ("qwen3",), describe, load_pre_norm_layers)
