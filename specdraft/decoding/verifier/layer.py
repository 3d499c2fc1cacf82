"""One decoder layer of the verifier, as its family's `Architecture` and its own `LayerKind` describe it: pre-norm
attention and a gated MLP (or routed experts), with q/k/v and gate/up fused into one matmul each and the runtime's
kernels. Every forward writes the keys and values of its N tokens at the cache slots it is given and attends with
`kernels.tree_attention`: the confirmed prefix fully, the N new tokens by a tree mask (causal for a chain,
ancestors for a tree), or, with a slot mask, exactly the slots it marks; a sliding-window layer within its window.
What a family adds (q/k norms, norms around the attention's and the MLP's outputs, another activation) costs
launches on that family's layers alone: the plain layout's layer launches what it always did.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.kernels.grouped_experts import grouped_experts
from specdraft.kernels.rms_norm import rms_norm
from specdraft.kernels.rope_cache import rope_cache
from specdraft.kernels.silu_mul import silu_mul
from specdraft.kernels.tree_attention import tree_attention
from specdraft.layers.quantized import QuantizedLinear
from specdraft.decoding.verifier.architecture import Architecture, Experts, LayerKind


def linear_layer(in_features: int, out_features: int, bias: bool, bits: Optional[int]) -> nn.Module:
    """nn.Linear, or with `bits` (8 or 4) an empty QuantizedLinear of that shape."""
    if bits is None:
        return nn.Linear(in_features, out_features, bias=bias)
    return QuantizedLinear(in_features, out_features, bias=bias, bits=bits)


def gated_activation(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up [..., I], the activation rounded to the dtype before the product (as HF's two ops)."""
    if activation == "silu":
        return silu_mul(gate, up)
    return F.gelu(gate, approximate="tanh") * up  # gelu_tanh


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """router_logits [N, E] -> (expert_ids [N, k], expert_weights [N, k] float32): the softmax over every expert,
    its top k, renormalised to sum 1 when asked (Qwen3-MoE's norm_topk_prob, Mixtral). Renormalised, that is the
    softmax of the top k logits: two launches, no host sync."""
    if renormalize:
        top_logits, expert_ids = router_logits.topk(top_k, dim=-1)
        return expert_ids, torch.softmax(top_logits, dim=-1, dtype=torch.float32)
    expert_weights, expert_ids = torch.softmax(router_logits, dim=-1, dtype=torch.float32).topk(top_k, dim=-1)
    return expert_ids, expert_weights


class RoutedExperts(nn.Module):
    """A mixture-of-experts MLP: the router's top k experts per row (`kernels.grouped_experts`, Hugging Face's
    gate_up_proj [E, 2I, H] / down_proj [E, H, I] layout), plus a gated shared expert where the family has one.
    Static shapes and the routing on the device: it runs inside the CUDA graphs."""

    def __init__(self, hidden_size: int, experts: Experts):
        super().__init__()
        count, width = experts.num_experts, experts.intermediate_size
        self.top_k, self.renormalize = experts.top_k, experts.renormalize
        self.router = nn.Parameter(torch.empty(count, hidden_size))  # [E, H]
        self.gate_up = nn.Parameter(torch.empty(count, 2 * width, hidden_size))  # [E, 2I, H]
        self.down = nn.Parameter(torch.empty(count, hidden_size, width))  # [E, H, I]
        self.shared = experts.shared_intermediate_size > 0
        if self.shared:
            self.shared_w13 = nn.Linear(hidden_size, 2 * experts.shared_intermediate_size, bias=False)
            self.shared_w2 = nn.Linear(experts.shared_intermediate_size, hidden_size, bias=False)
            self.shared_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, normed: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        expert_ids, expert_weights = route(F.linear(normed, self.router), self.top_k, self.renormalize)
        out = grouped_experts(normed, self.gate_up, self.down, expert_ids, expert_weights)
        if self.shared:
            shared = self.shared_w2(silu_mul(*self.shared_w13(normed).chunk(2, dim=-1)))
            out = out + torch.sigmoid(self.shared_gate(normed)) * shared
        return out


class DecoderLayer(nn.Module):
    def __init__(self, info: TargetInfo, architecture: Architecture, kind: LayerKind, bits: Optional[int] = None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = info.num_heads, info.num_kv_heads, info.head_dim
        self.eps, self.kind, self.activation = info.rms_norm_eps, kind, architecture.activation
        self.scale = architecture.scale(info.head_dim)
        self.qk_norm, self.sandwich_norms = architecture.qk_norm, architecture.sandwich_norms
        self.norm_in_fp32 = architecture.norm.weight_in_fp32
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.wqkv = linear_layer(info.hidden_size, qkv_width, architecture.qkv_bias, bits)
        self.wo = linear_layer(self.heads * self.head_dim, info.hidden_size, False, bits)
        self.attn_norm = nn.Parameter(torch.ones(info.hidden_size))
        self.mlp_norm = nn.Parameter(torch.ones(info.hidden_size))
        if self.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(info.head_dim))
            self.k_norm = nn.Parameter(torch.ones(info.head_dim))
        if self.sandwich_norms:
            self.post_attn_norm = nn.Parameter(torch.ones(info.hidden_size))
            self.post_mlp_norm = nn.Parameter(torch.ones(info.hidden_size))
        if kind.experts is not None:
            if bits is not None:
                raise SpecdraftError(f"a weight-only quantized verifier ({bits}-bit) runs dense targets; this one's "
                                     "layers are mixture-of-experts: use runtime.quantization=none")
            self.experts = RoutedExperts(info.hidden_size, kind.experts)
        else:
            self.w13 = linear_layer(info.hidden_size, 2 * kind.intermediate_size, False, bits)
            self.w2 = linear_layer(kind.intermediate_size, info.hidden_size, False, bits)

    @property
    def sliding_window(self) -> Optional[int]:
        return self.kind.sliding_window

    def forward(self, hidden, pending, rope, positions, k_cache, v_cache, slots, prefix_len, tree_mask,
                causal_prefill: bool, slot_mask: Optional[torch.Tensor] = None,
                sliding_window: Optional[int] = None):
        """hidden [N, H] and pending [N, H] or None: the layer's input is hidden + pending (the previous layer's MLP
        output, added in this layer's first norm launch); rope (cos, sin) tables [S, D]; positions [N]; k/v_cache
        [Hkv, S, D] (this layer's); slots [N]; slot_mask [N, S] bool or None (`_attend`); sliding_window: the
        window this forward honours (None: full attention) -> (layer input, hidden after attention, MLP output),
        each [N, H].
        Launches (the plain layout): add + norm, qkv matmul, rope + cache write, attention, o matmul, add + norm,
        gate/up matmul, silu * up, down matmul."""
        hidden, q = self.attention_input(hidden, pending, rope, positions, k_cache, v_cache, slots)
        attn = self._attend(q, k_cache, v_cache, prefix_len, tree_mask, causal_prefill, slot_mask, positions,
                            sliding_window)  # [Hq, N, D]
        return (hidden, *self.attention_output(attn, hidden))

    def norm(self, x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None):
        """The family's RMSNorm of x (of x + residual: -> (normed, the sum)), its weight's offset folded in."""
        return rms_norm(x, weight, self.eps, residual, self.norm_in_fp32)

    def attention_input(self, hidden, pending, rope, positions, k_cache, v_cache, slots):
        """The layer up to its attention: (add +) norm, qkv matmul, (q/k norms,) rope + the cache write of k and v
        at `slots` -> (layer input [N, H], rotated q [Hq, N, D]). Arguments as `forward`'s."""
        n = hidden.shape[0]
        if pending is None:
            normed = self.norm(hidden, self.attn_norm)
        else:
            normed, hidden = self.norm(pending, self.attn_norm, hidden)
        qkv = self.wqkv(normed)  # [N, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q, k = q.view(n, self.heads, self.head_dim), k.view(n, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.norm(q, self.q_norm), self.norm(k, self.k_norm)
        q = rope_cache(q, k, v.view(n, self.kv_heads, self.head_dim), *rope, positions, k_cache, v_cache,
                       slots)  # [Hq, N, D]
        return hidden, q

    def attention_output(self, attn, hidden):
        """The layer after its attention: attn [Hq, N, D], hidden [N, H] the layer input -> (hidden after
        attention, MLP output), each [N, H]: o matmul, (norm,) add + norm, the MLP or the experts, (norm)."""
        n = hidden.shape[0]
        attended = self.wo(attn.transpose(0, 1).reshape(n, -1))  # [N, H]
        if self.sandwich_norms:
            attended = self.norm(attended, self.post_attn_norm)
        normed, attended = self.norm(attended, self.mlp_norm, hidden)
        out = self.mlp(normed)
        if self.sandwich_norms:
            out = self.norm(out, self.post_mlp_norm)
        return attended, out

    def mlp(self, normed: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        if self.kind.experts is not None:
            return self.experts(normed)
        return self.w2(gated_activation(*self.w13(normed).chunk(2, dim=-1), self.activation))

    def _attend(self, q, k_cache, v_cache, prefix_len, tree_mask, causal_prefill: bool,
                slot_mask: Optional[torch.Tensor], positions: torch.Tensor,
                sliding_window: Optional[int]) -> torch.Tensor:
        """q [Hq, N, D] over the cache (its N new keys already written) -> [Hq, N, D]. With a slot_mask [N, S],
        each query sees exactly the slots it marks (rows scattered over the cache, `run_layers_at`); a sliding
        window hides the slots before it (by slot, which is the position for the confirmed tokens and at least it
        for scattered rows: exact while the rows' depth stays under the window)."""
        gqa = self.heads != self.kv_heads
        if slot_mask is not None:
            if sliding_window is not None:
                slot_positions = torch.arange(k_cache.shape[1], device=q.device)  # [S]
                slot_mask = slot_mask & (slot_positions[None, :] > (positions - sliding_window)[:, None])
            return F.scaled_dot_product_attention(q[None], k_cache[None], v_cache[None], attn_mask=slot_mask,
                                                  scale=self.scale, enable_gqa=gqa)[0]
        if causal_prefill:  # the whole prompt at once, from an empty cache: its keys are slots 0..N-1
            return self._prefill_attention(q, k_cache[:, :q.shape[1]], v_cache[:, :q.shape[1]], sliding_window)
        return tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, self.scale, sliding_window=sliding_window,
                              positions=positions)

    def _prefill_attention(self, q, keys, values, sliding_window: Optional[int]) -> torch.Tensor:
        """q [Hq, N, D] over keys, values [Hkv, N, D], causal (and within the sliding window) -> [Hq, N, D]."""
        n, gqa = q.shape[1], self.heads != self.kv_heads
        if sliding_window is None or sliding_window >= n:
            return F.scaled_dot_product_attention(q[None], keys[None], values[None], is_causal=True, scale=self.scale,
                                                  enable_gqa=gqa)[0]
        rows = torch.arange(n, device=q.device)
        offsets = rows[:, None] - rows[None, :]  # [N, N] query position - key position
        mask = (offsets >= 0) & (offsets < sliding_window)
        if gqa:  # the masked kernels' grouped-query support varies: the heads repeated instead
            group = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, scale=self.scale)[0]
