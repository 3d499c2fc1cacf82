"""The EAGLE-3 decoder layer's training forward around its attention call, as functions of the layer and its
matmul weights: what train.compile compiles (specdraft.layers.compile), with the weights cast outside the
compiled code (specdraft.layers.cast) so a TTT unroll keeps one copy of each for the backward."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specdraft.layers.blocks import swiglu
from specdraft.layers.cast import compute_weight


class LayerWeights:
    """A decoder layer's matmul weights as its training forward reads them, each cast at its first use and kept
    by this object (an unroll's, shared by its steps; or one call's)."""

    def __init__(self, layer):
        self.layer = layer

    @functools.cached_property
    def qkv(self) -> torch.Tensor:  # [(h + 2 kvh) D, 2H]: q_proj, k_proj, v_proj joined, one matmul
        attn = self.layer.self_attn
        return compute_weight(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)

    @functools.cached_property
    def o(self) -> torch.Tensor:  # [H, h D]
        return compute_weight(self.layer.self_attn.o_proj.weight)

    @functools.cached_property
    def gate_up(self) -> torch.Tensor:  # [2I, H]: gate_proj, up_proj joined, one matmul
        return compute_weight(self.layer.mlp.gate_proj.weight, self.layer.mlp.up_proj.weight)

    @functools.cached_property
    def down(self) -> torch.Tensor:  # [H, I]
        return compute_weight(self.layer.mlp.down_proj.weight)


def attention_inputs(layer, hidden, embeds, positions, qkv_weight):
    """The layer up to its attention call: norms, [embedding ; hidden], q/k/v projections, rotary.
    hidden, embeds [B, T, H] -> q [B, h, T, D], k, v [B, kvh, T, D].

    Inside the layer's forward, its norms run through `forward` rather than as module calls: under ZeRO-3 every
    module call costs DeepSpeed's fetch, release and backward hooks on the host (the layer registers the norms'
    weights as external parameters, so its own call gathers them)."""
    normed = [layer.input_layernorm.forward(embeds), layer.hidden_norm.forward(hidden)]
    attn_in = torch.cat(normed, dim=-1)  # [B, T, 2H]
    return layer.self_attn.project(attn_in, positions, qkv_weight)


def attention_residual(hidden, attn, o_weight):  # [B, T, H], [B, h, T, D], [H, h D] -> [B, T, H]
    return hidden + F.linear(attn.transpose(1, 2).reshape(*hidden.shape[:2], -1), o_weight)


def mlp_residual(layer, hidden, gate_up_weight, down_weight):  # [B, T, H] -> [B, T, H]
    lean = layer.checkpointing != "none"
    normed = layer.post_attention_layernorm.forward(hidden)  # no module call (attention_inputs)
    return hidden + swiglu(normed, gate_up_weight, down_weight, recompute_pointwise=lean)
