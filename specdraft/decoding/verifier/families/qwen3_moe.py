"""Qwen3-MoE: Qwen3's attention (q/k norms) and mixture-of-experts MLPs: a softmax router over num_experts, each row
through its num_experts_per_tok experts, the weights renormalised where norm_topk_prob says, no shared expert; the
layers in mlp_only_layers, or off the decoder_sparse_step, keep a dense MLP. A sliding window, where the config
turns one on, is every layer's."""
from torch import nn

from specdraft.decoding.verifier.architecture import Architecture, Experts, LayerKind
from specdraft.decoding.verifier.families.base import (Family, activation, check_no_biases, layer_windows,
                                                       load_dense_mlp, load_experts, load_pre_norm_layers, qkv_bias,
                                                       text_config)
from specdraft.decoding.verifier.layer import DecoderLayer
from specdraft.decoding.verifier.model import VerifierModel


def sparse_layers(config):
    """Which layers route to experts (Qwen2/3-MoE's rule)."""
    return [index not in (config.mlp_only_layers or []) and config.num_experts > 0
            and (index + 1) % config.decoder_sparse_step == 0 for index in range(config.num_hidden_layers)]


def describe(hf_model: nn.Module) -> Architecture:
    config, decoder = text_config(hf_model), hf_model.get_decoder()
    check_no_biases(decoder)
    experts = Experts(config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                      renormalize=bool(config.norm_topk_prob))
    kinds = tuple(LayerKind(config.intermediate_size, sliding_window=window, experts=experts if sparse else None)
                  for window, sparse in zip(layer_windows(config), sparse_layers(config)))
    return Architecture(layers=kinds, qkv_bias=qkv_bias(decoder), qk_norm=True,
                        activation=activation(config.hidden_act))


def load_mlp(layer: DecoderLayer, mlp: nn.Module) -> None:
    if layer.kind.experts is None:
        load_dense_mlp(layer, mlp)
    else:
        load_experts(layer.experts, mlp.gate.weight, mlp.experts.gate_up_proj, mlp.experts.down_proj)


def load(hf_model: nn.Module, model: VerifierModel) -> None:
    load_pre_norm_layers(hf_model, model, load_mlp)


FAMILY = Family("qwen3_moe", ("qwen3_moe",), describe, load)
