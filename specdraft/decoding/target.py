"""The target as the runtime runs it: a compact Llama-family decoder (Llama, Qwen2, SmolLM2) with a static KV
cache, batch 1, in the spirit of gpt-fast.

Weights come from a Hugging Face model (hub id, directory or GGUF, through `specdraft.targets.load_target`);
q/k/v and gate/up are fused into one matmul each. Rotary tables come from the HF model's own rotary module, so
every rope scaling it supports (Llama-3's included) is reproduced. Every forward writes the keys and values of
its N tokens at cache slots prefix_len..prefix_len+N-1 and attends with `kernels.tree_attention`: the
confirmed prefix fully, the N new tokens by a tree mask (causal for a chain, ancestors for a tree). A drafter's
pass over tree nodes scattered in the cache (`run_layers_at`) writes at the slots it is given and attends by a
mask over every slot instead.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.rms_norm import rms_norm
from specdraft.kernels.rope_cache import rope_cache
from specdraft.kernels.silu_mul import silu_mul
from specdraft.kernels.tree_attention import tree_attention
from specdraft.core.types import TargetInfo

SUPPORTED = ("llama", "qwen2", "mistral")


class DecoderLayer(nn.Module):
    def __init__(self, info: TargetInfo, qkv_bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = info.num_heads, info.num_kv_heads, info.head_dim
        self.eps = info.rms_norm_eps
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.wqkv = nn.Linear(info.hidden_size, qkv_width, bias=qkv_bias)
        self.wo = nn.Linear(self.heads * self.head_dim, info.hidden_size, bias=False)
        self.w13 = nn.Linear(info.hidden_size, 2 * info.intermediate_size, bias=False)
        self.w2 = nn.Linear(info.intermediate_size, info.hidden_size, bias=False)
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


class TargetModel(nn.Module):
    """Batch-1 decoder with a static KV cache of `max_len` slots: [L, Hkv, S, D] keys and values."""

    def __init__(self, info: TargetInfo, qkv_bias: bool = False):
        super().__init__()
        self.info = info
        self.embed_tokens = nn.Embedding(info.vocab_size, info.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(info, qkv_bias) for _ in range(info.num_layers))
        self.norm = nn.Parameter(torch.ones(info.hidden_size))
        self.lm_head = nn.Linear(info.hidden_size, info.vocab_size, bias=False)
        self.max_len = 0

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H]
        return self.lm_head.weight

    def allocate(self, max_len: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> None:
        """Static caches for `max_len` slots; rope tables [max_len, D]."""
        info, weight = self.info, self.lm_head.weight
        shape = (info.num_layers, info.num_kv_heads, max_len, info.head_dim)
        self.k_cache = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope_cos, self.rope_sin = rope_cos.to(weight), rope_sin.to(weight)
        self.max_len = max_len

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [N] -> [N, H]
        return self.embed_tokens(tokens)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        return rms_norm(hidden, self.norm, self.info.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] (pre-norm) -> [N, V]
        return self.lm_head(self.final_norm(hidden))

    def run_layers(self, hidden: torch.Tensor, positions: torch.Tensor, prefix_len: torch.Tensor,
                   tree_mask: Optional[torch.Tensor], start_layer: int = 0, end_layer: Optional[int] = None,
                   capture: Iterable[int] = ()) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
        """hidden [N, H] entering layer `start_layer`; positions [N]; prefix_len [1] int64; tree_mask [N, N] bool
        (None: a causal prefill from an empty cache) -> (hidden [N, H] after `end_layer`-1, {i: input of layer i})."""
        slots = prefix_len + torch.arange(hidden.shape[0], device=hidden.device)  # [N]
        attention = {"prefix_len": prefix_len, "tree_mask": tree_mask, "causal_prefill": tree_mask is None}
        return self._layers(hidden, positions, slots, attention, start_layer, end_layer, capture)

    def run_layers_at(self, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      slot_mask: torch.Tensor, end_layer: int,
                      capture: Iterable[int] = ()) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
        """Embeddings hidden [N, H] at positions [N] through layers 0..end_layer-1, their KV written at any cache
        slots [N], row i attending to the slots slot_mask [N, S] marks -> as `run_layers`. For a drafter's pass
        over tree nodes whose ancestors sit anywhere in the cache: `tree_attention` sees one window of nodes."""
        attention = {"prefix_len": None, "tree_mask": None, "causal_prefill": False, "slot_mask": slot_mask}
        return self._layers(hidden, positions, slots, attention, 0, end_layer, capture)

    def _layers(self, hidden, positions, slots, attention: dict, start_layer: int, end_layer: Optional[int],
                capture: Iterable[int]) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
        """The layer loop of `run_layers` and `run_layers_at`; `attention` holds the layers' attention arguments."""
        end_layer = self.info.num_layers if end_layer is None else end_layer
        capture = set(capture)
        captured, pending = {}, None
        for index in range(start_layer, end_layer):  # each layer adds the previous one's MLP output
            layer_input, hidden, pending = self.layers[index](
                hidden, pending, (self.rope_cos, self.rope_sin), positions, self.k_cache[index], self.v_cache[index],
                slots, **attention)
            if index in capture:
                captured[index] = layer_input
        if pending is not None:
            hidden = hidden + pending
        if end_layer in capture:
            captured[end_layer] = hidden
        return hidden, captured


def _copy(dst: nn.Module | nn.Parameter, *sources: torch.Tensor) -> None:
    target = dst.weight if isinstance(dst, nn.Module) else dst
    target.data.copy_(torch.cat(sources, dim=0) if len(sources) > 1 else sources[0])


@torch.no_grad()
def from_hf(hf_model, info: TargetInfo) -> TargetModel:
    """A TargetModel with the weights of a Hugging Face Llama-family causal LM (same device and dtype)."""
    if info.model_type not in SUPPORTED:
        raise SpecdraftError(f"the runtime runs Llama-family targets {SUPPORTED}; this target is {info.model_type!r}")
    decoder = hf_model.get_decoder()
    first_attn = decoder.layers[0].self_attn
    qkv_bias = first_attn.q_proj.bias is not None
    weight = hf_model.get_input_embeddings().weight
    with torch.device(weight.device):
        model = TargetModel(info, qkv_bias).to(weight.dtype)
    model.embed_tokens.weight.copy_(weight)
    model.lm_head.weight.copy_(hf_model.get_output_embeddings().weight)
    model.norm.copy_(decoder.norm.weight)
    for layer, hf_layer in zip(model.layers, decoder.layers):
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        _copy(layer.wqkv, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
        if qkv_bias:
            layer.wqkv.bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        _copy(layer.wo, attn.o_proj.weight)
        _copy(layer.w13, mlp.gate_proj.weight, mlp.up_proj.weight)
        _copy(layer.w2, mlp.down_proj.weight)
        _copy(layer.attn_norm, hf_layer.input_layernorm.weight)
        _copy(layer.mlp_norm, hf_layer.post_attention_layernorm.weight)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def hf_rope_tables(hf_model, max_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, D] from the HF model's own rotary embedding (its rope scaling included)."""
    decoder = hf_model.get_decoder()
    weight = hf_model.get_input_embeddings().weight
    positions = torch.arange(max_len, device=weight.device)[None]
    probe = torch.zeros(1, max_len, 1, device=weight.device, dtype=torch.float32)
    cos, sin = decoder.rotary_emb(probe, positions)
    return cos[0], sin[0]
