"""The EAGLE-3 decoder layer's training forward around its attention call, as functions of the layer and its
matmul weights: what train.compile compiles (specdraft.layers.compile), with the weights cast outside the
compiled code (specdraft.layers.cast) so a TTT unroll keeps one copy of each for the backward.

And the same layer as the runtime's drafters run it (EAGLE-3's and PosS's, batch 1, rows [M, H]): `layer_query`
up to the attention call, `layer_tail` after it, in as few launches as the kernels allow."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from specdraft.kernels.draft_input import draft_input
from specdraft.kernels.rms_norm import rms_norm
from specdraft.kernels.rope_cache import rope_cache
from specdraft.kernels.silu_mul import silu_mul
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


@dataclass(frozen=True)
class RuntimeWeights:
    """The midlayer's matmul weights as the runtime reads them, q/k/v and gate/up each joined into one matmul.
    A drafter builds them in `allocate`, once the draft has its device and dtype."""
    qkv: torch.Tensor  # [(h + 2 kvh) D, 2H]
    o: torch.Tensor  # [H, h D]
    gate_up: torch.Tensor  # [2I, H]
    down: torch.Tensor  # [H, I]

    @classmethod
    @torch.no_grad()
    def of(cls, layer) -> "RuntimeWeights":  # layer: eagle3.Eagle3DecoderLayer
        weights = layer.compute_weights()
        return cls(qkv=weights.qkv, o=weights.o, gate_up=weights.gate_up, down=weights.down)


def layer_tail(layer, weights: RuntimeWeights, final_norm, hidden: torch.Tensor, attn_out: torch.Tensor):
    """The runtime's midlayer (an eagle3.Eagle3DecoderLayer) after attention, the bits of the modules' own
    forward: hidden + attn_out and the post-attention norm (one launch), gate/up in one matmul, silu * up in one
    launch, and the closing residual add with the head's final norm (the RMSNorm final_norm; one launch).
    hidden, attn_out [M, H] -> (final_norm(out), out), each [M, H]."""
    normed, hidden = fused_norm(layer.post_attention_layernorm, attn_out, hidden)
    gate_up = F.linear(normed, weights.gate_up)  # [M, 2I]
    return fused_norm(final_norm, F.linear(silu_mul(*gate_up.chunk(2, dim=-1)), weights.down), hidden)


def layer_query(layer, weights: RuntimeWeights, hidden, tokens, embed_weight, rope, rope_positions, k_cache, v_cache,
                slots, position_offset: int = 0, slot_base: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The runtime's midlayer up to attention: hidden [M, H]; tokens [M] (their embeddings are the rows of
    embed_weight [V, H], the target's table); rope (cos, sin) [S, D]; rope_positions, slots [M] -> rotated queries
    [Hq, M, D] (rotated at rope_positions + position_offset); the rotated keys and the values go to k_cache,
    v_cache [Hkv, S, D] (or [C, Hkv, S, D]: every copy) at `slots` (+ slot_base [1], when given). Launches: the
    joined, normed input (`kernels.draft_input`), the q/k/v matmul, rope + cache."""
    attn, m = layer.self_attn, hidden.shape[0]
    x = draft_input(tokens, embed_weight, hidden, layer.input_layernorm.weight, layer.hidden_norm.weight,
                    layer.input_layernorm.eps)  # [M, 2H] (both norms have the target's eps)
    kv_width = attn.kv_heads * attn.head_dim
    q, k, v = F.linear(x, weights.qkv).split([attn.heads * attn.head_dim, kv_width, kv_width], dim=-1)
    return rope_cache(q.view(m, attn.heads, -1), k.view(m, attn.kv_heads, -1), v.view(m, attn.kv_heads, -1), *rope,
                      rope_positions, k_cache, v_cache, slots, position_offset, slot_base)


def fused_norm(norm, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
    """`layers.RMSNorm` (weight product in float32) as one `kernels.rms_norm` launch, the same bits: x [M, H] ->
    [M, H]; with a residual [M, H] -> (norm(x + residual), x + residual)."""
    return rms_norm(x, norm.weight, norm.eps, residual, weight_in_fp32=True)
