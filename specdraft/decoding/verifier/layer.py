"""One decoder layer of the verifier (Llama family: pre-norm attention and SwiGLU MLP), with q/k/v and gate/up fused
into one matmul each and the runtime's kernels. Every forward writes the keys and values of its N tokens at the
cache slots it is given and attends with `kernels.tree_attention`: the confirmed prefix fully, the N new tokens by
a tree mask (causal for a chain, ancestors for a tree), or, with a slot mask, exactly the slots it marks.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.core.types import TargetInfo
from specdraft.kernels.rms_norm import rms_norm
from specdraft.kernels.rope_cache import rope_cache
from specdraft.kernels.silu_mul import silu_mul
from specdraft.kernels.tree_attention import tree_attention
from specdraft.layers.quantized import QuantizedLinear


def linear_layer(in_features: int, out_features: int, bias: bool, bits: Optional[int]) -> nn.Module:
    """nn.Linear, or with `bits` (8 or 4) an empty QuantizedLinear of that shape."""
    if bits is None:
        return nn.Linear(in_features, out_features, bias=bias)
    return QuantizedLinear(in_features, out_features, bias=bias, bits=bits)


class DecoderLayer(nn.Module):
    def __init__(self, info: TargetInfo, qkv_bias: bool, bits: Optional[int] = None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = info.num_heads, info.num_kv_heads, info.head_dim
        self.eps = info.rms_norm_eps
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.wqkv = linear_layer(info.hidden_size, qkv_width, qkv_bias, bits)
        self.wo = linear_layer(self.heads * self.head_dim, info.hidden_size, False, bits)
        self.w13 = linear_layer(info.hidden_size, 2 * info.intermediate_size, False, bits)
        self.w2 = linear_layer(info.intermediate_size, info.hidden_size, False, bits)
        self.attn_norm = nn.Parameter(torch.ones(info.hidden_size))
        self.mlp_norm = nn.Parameter(torch.ones(info.hidden_size))

    def forward(self, hidden, pending, rope, positions, k_cache, v_cache, slots, prefix_len, tree_mask,
                causal_prefill: bool, slot_mask: Optional[torch.Tensor] = None):
        """hidden [N, H] and pending [N, H] or None: the layer's input is hidden + pending (the previous layer's MLP
        output, added in this layer's first norm launch); rope (cos, sin) tables [S, D]; positions [N]; k/v_cache
        [Hkv, S, D] (this layer's); slots [N]; slot_mask [N, S] bool or None (`_attend`) -> (layer input, hidden
        after attention, MLP output), each [N, H].
        Launches: add + norm, qkv matmul, rope + cache write, attention, o matmul, add + norm, gate/up matmul,
        silu * up, down matmul."""
        hidden, q = self.attention_input(hidden, pending, rope, positions, k_cache, v_cache, slots)
        attn = self._attend(q, k_cache, v_cache, prefix_len, tree_mask, causal_prefill, slot_mask)  # [Hq, N, D]
        return (hidden, *self.attention_output(attn, hidden))

    def attention_input(self, hidden, pending, rope, positions, k_cache, v_cache, slots):
        """The layer up to its attention: (add +) norm, qkv matmul, rope + the cache write of k and v at `slots`
        -> (layer input [N, H], rotated q [Hq, N, D]). Arguments as `forward`'s."""
        n = hidden.shape[0]
        if pending is None:
            normed = rms_norm(hidden, self.attn_norm, self.eps)
        else:
            normed, hidden = rms_norm(pending, self.attn_norm, self.eps, hidden)
        qkv = self.wqkv(normed)  # [N, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q = rope_cache(q.view(n, self.heads, self.head_dim), k.view(n, self.kv_heads, self.head_dim),
                       v.view(n, self.kv_heads, self.head_dim), *rope, positions, k_cache, v_cache, slots)  # [Hq, N, D]
        return hidden, q

    def attention_output(self, attn, hidden):
        """The layer after its attention: attn [Hq, N, D], hidden [N, H] the layer input -> (hidden after
        attention, MLP output), each [N, H]: o matmul, add + norm, gate/up matmul, silu * up, down matmul."""
        n = hidden.shape[0]
        normed, attended = rms_norm(self.wo(attn.transpose(0, 1).reshape(n, -1)), self.mlp_norm, self.eps, hidden)
        return attended, self.w2(silu_mul(*self.w13(normed).chunk(2, dim=-1)))

    def _attend(self, q, k_cache, v_cache, prefix_len, tree_mask, causal_prefill: bool,
                slot_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """q [Hq, N, D] over the cache (its N new keys already written) -> [Hq, N, D]. With a slot_mask [N, S],
        each query sees exactly the slots it marks (rows scattered over the cache, `run_layers_at`)."""
        scale = self.head_dim ** -0.5
        gqa = self.heads != self.kv_heads
        if slot_mask is not None:
            return F.scaled_dot_product_attention(q[None], k_cache[None], v_cache[None], attn_mask=slot_mask,
                                                  scale=scale, enable_gqa=gqa)[0]
        if causal_prefill:  # the whole prompt at once, from an empty cache: its keys are slots 0..N-1
            n = q.shape[1]
            return F.scaled_dot_product_attention(q[None], k_cache[None, :, :n], v_cache[None, :, :n], is_causal=True,
                                                  scale=scale, enable_gqa=gqa)[0]
        return tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, scale)
