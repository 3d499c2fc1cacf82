"""Mixtral: the Llama layout with a mixture-of-experts MLP on every layer, the router's top num_experts_per_tok of
num_local_experts, their weights the softmax over the top k logits (softmax, top k, renormalised), no shared
expert; a sliding window on every layer where the config sets one."""
from torch import nn

from specdraft.decoding.verifier.architecture import Architecture, Experts, LayerKind
from specdraft.decoding.verifier.families.base import (Family, activation, check_no_biases, layer_windows,
                                                       load_experts, load_pre_norm_layers, qkv_bias, text_config)
from specdraft.decoding.verifier.layer import DecoderLayer
from specdraft.decoding.verifier.model import VerifierModel


def describe(hf_model: nn.Module) -> Architecture:
    config, decoder = text_config(hf_model), hf_model.get_decoder()
    check_no_biases(decoder)
    experts = Experts(config.num_local_experts, config.num_experts_per_tok, config.intermediate_size,
                      renormalize=True)
    kinds = tuple(LayerKind(config.intermediate_size, sliding_window=window, experts=experts)
                  for window in layer_windows(config))
    return Architecture(layers=kinds, qkv_bias=qkv_bias(decoder), activation=activation(config.hidden_act))


def load_mlp(layer: DecoderLayer, mlp: nn.Module) -> None:
    load_experts(layer.experts, mlp.gate.weight, mlp.experts.gate_up_proj, mlp.experts.down_proj)


def load(hf_model: nn.Module, model: VerifierModel) -> None:
    load_pre_norm_layers(hf_model, model, load_mlp)


FAMILY = Family("mixtral", ("mixtral",), describe, load)
