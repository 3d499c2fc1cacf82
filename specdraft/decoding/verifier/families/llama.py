"""The Llama layout: Llama, Qwen2 (biases on q, k, v), Mistral (a sliding window on every layer where its config
sets one), and the language models of Qwen2-VL and Qwen2.5-VL (M-RoPE: the prompt's own rotary tables,
targets/vision.py). Pre-norm attention and a SwiGLU MLP, Llama's RMSNorm, one rotary table."""
from torch import nn

from specdraft.decoding.verifier.architecture import Architecture, LayerKind
from specdraft.decoding.verifier.families.base import (Family, activation, check_no_biases, layer_windows,
                                                       load_pre_norm_layers, qkv_bias, text_config)


def describe(hf_model: nn.Module) -> Architecture:
    config, decoder = text_config(hf_model), hf_model.get_decoder()
    check_no_biases(decoder)
    kinds = tuple(LayerKind(config.intermediate_size, sliding_window=window) for window in layer_windows(config))
    return Architecture(layers=kinds, qkv_bias=qkv_bias(decoder), activation=activation(config.hidden_act))


FAMILY = Family("llama", ("llama", "qwen2", "mistral", "qwen2_vl_text", "qwen2_5_vl_text"), describe,
                load_pre_norm_layers)
