"""Qwen2-MoE: Qwen2's attention (biases on q, k, v) and mixture-of-experts MLPs with one shared expert beside the
routed ones (a SwiGLU MLP of shared_expert_intermediate_size, its output gated by sigmoid(x . g)); the routed
weights the softmax's own unless norm_topk_prob renormalises them; dense layers by Qwen3-MoE's rule; sliding
windows where layer_types say."""
from torch import nn

from specdraft.decoding.verifier.architecture import Architecture, Experts, LayerKind
from specdraft.decoding.verifier.families.base import (Family, activation, check_no_biases, copy_into,
                                                       layer_windows, load_dense_mlp, load_experts,
                                                       load_pre_norm_layers, qkv_bias, text_config)
from specdraft.decoding.verifier.families.qwen3_moe import sparse_layers
from specdraft.decoding.verifier.layer import DecoderLayer
from specdraft.decoding.verifier.model import VerifierModel


def describe(hf_model: nn.Module) -> Architecture:
    config, decoder = text_config(hf_model), hf_model.get_decoder()
    check_no_biases(decoder)
    experts = Experts(config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                      renormalize=bool(config.norm_topk_prob),
                      shared_intermediate_size=config.shared_expert_intermediate_size)
    kinds = tuple(LayerKind(config.intermediate_size, sliding_window=window, experts=experts if sparse else None)
                  for window, sparse in zip(layer_windows(config), sparse_layers(config)))
    return Architecture(layers=kinds, qkv_bias=qkv_bias(decoder), activation=activation(config.hidden_act))


def load_mlp(layer: DecoderLayer, mlp: nn.Module) -> None:
    if layer.kind.experts is None:
        load_dense_mlp(layer, mlp)
        return
    experts = layer.experts
    load_experts(experts, mlp.gate.weight, mlp.experts.gate_up_proj, mlp.experts.down_proj)
    copy_into(experts.shared_w13, mlp.shared_expert.gate_proj, mlp.shared_expert.up_proj)
    copy_into(experts.shared_w2, mlp.shared_expert.down_proj)
    copy_into(experts.shared_gate, mlp.shared_expert_gate)


def load(hf_model: nn.Module, model: VerifierModel) -> None:
    load_pre_norm_layers(hf_model, model, load_mlp)


FAMILY = Family("qwen2_moe", ("qwen2_moe",), describe, load)
