"""DFlash in the runtime: a block drafter (core/drafting.py, DrafterCaps.block_size): `ingest` writes each draft
layer's context keys and values of the confirmed positions; `propose` runs the block [root, mask, ..., mask] at
positions n..n+B-1 through the layers in one pass and returns the B - 1 drafted positions' logits.

Per layer the drafter's cache holds, at slots 0..n-1, the keys k_norm(k_proj(context)) (rotated at their positions)
and values v_proj(context) of the fused context hidden_norm(fc(features)) of each confirmed position, as training's
context columns; `propose` writes the block's own keys at slots n..n+B-1 (scratch: the next ingest overwrites them)
and every block position attends to the prefix and to the whole block (bidirectional), as in training."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch
import torch.nn.functional as F

from specdraft.core.drafting import Drafter, DrafterCaps
from specdraft.kernels.rope_cache import rope_cache
from specdraft.kernels.silu_mul import silu_mul
from specdraft.kernels.tree_attention import tree_attention
from specdraft.layers.decoder_parts import fused_norm
from specdraft.layers.draft_cache import ingest_slots, rope_tables
from specdraft.methods.dflash.config import DFlashConfig
from specdraft.methods.dflash.model import DFlashDecoderLayer, DFlashDraft


@dataclass(frozen=True)
class LayerWeights:
    """A draft layer's matmul weights as the drafter reads them, joined where one matmul serves."""
    qkv: torch.Tensor  # [(h + 2 kvh) D, H]
    kv: torch.Tensor  # [2 kvh D, H]: the context's keys and values
    o: torch.Tensor  # [H, h D]
    gate_up: torch.Tensor  # [2I, H]
    down: torch.Tensor  # [H, I]

    @classmethod
    @torch.no_grad()
    def of(cls, layer: DFlashDecoderLayer) -> "LayerWeights":
        attn, mlp = layer.self_attn, layer.mlp
        kv = torch.cat([attn.k_proj.weight, attn.v_proj.weight])
        return cls(qkv=torch.cat([attn.q_proj.weight, kv]), kv=kv, o=attn.o_proj.weight,
                   gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), down=mlp.down_proj.weight)


class DFlashDrafter(Drafter):
    """The runtime's DFlash drafter (module docstring)."""

    def __init__(self, draft: DFlashDraft, target_model):
        self.draft, self.embed_weight = draft, target_model.embed_tokens.weight  # [V, H]
        self.head = draft.lm_head if draft.lm_head is not None else target_model.lm_head  # [H] -> [Vd]
        self.caps = DrafterCaps(block_size=draft.block_size)
        self.feature_layers, self.d2t = list(draft.feature_layers), draft.d2t
        attn = draft.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim, self.theta = attn.heads, attn.kv_heads, attn.head_dim, attn.rope_theta

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        slots = max_len + self.draft.block_size  # the block's scratch past any prefix the engine keeps
        shape = (self.kv_heads, slots, self.head_dim)
        self.k_caches = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.draft.layers]
        self.v_caches = [torch.zeros(shape, device=device, dtype=dtype) for _ in self.draft.layers]
        self.rope = rope_tables(slots, self.head_dim, self.theta, device, self.draft.fc.weight.dtype)
        self.weights = [LayerWeights.of(layer) for layer in self.draft.layers]
        block = self.draft.block_size
        self.offsets = torch.arange(block, device=device)  # [B]
        self.mask_ids = torch.full((block - 1,), self.draft.mask_token_id, dtype=torch.long, device=device)
        self.sees_block = torch.ones(block, block, dtype=torch.bool, device=device)  # [B, B] bidirectional
        self.d2t = self.d2t.to(device)

    def state_tensors(self) -> List[torch.Tensor]:
        return self.k_caches + self.v_caches

    @torch.no_grad()
    def ingest(self, features, next_tokens, start, count) -> None:
        """The confirmed rows' context keys and values, each layer's, at their slots (rows >= count: padding past
        the prefix, overwritten before anything reads them)."""
        aux = torch.cat([features[i] for i in self.feature_layers], dim=-1)  # [M, nH]
        context = fused_norm(self.draft.hidden_norm, F.linear(aux.to(self.draft.fc.weight.dtype),
                                                              self.draft.fc.weight))  # [M, H]
        slots = ingest_slots(start, aux.shape[0], aux.device)  # [M] = positions
        for layer, weights, k_cache, v_cache in zip(self.draft.layers, self.weights, self.k_caches, self.v_caches):
            keys, values = F.linear(context, weights.kv).view(-1, 2 * self.kv_heads, self.head_dim).chunk(2, dim=1)
            keys = fused_norm(layer.self_attn.k_norm, keys)  # [M, kvh, D]
            rope_cache(keys, keys, values, *self.rope, slots, k_cache, v_cache, slots)  # writes rotated keys

    @torch.no_grad()
    def propose(self, root_token, prefix_len) -> torch.Tensor:
        block = self.draft.block_size
        tokens = torch.cat([root_token, self.mask_ids])  # [B]
        hidden = F.embedding(tokens, self.embed_weight).to(self.draft.fc.weight.dtype)  # [B, H]
        positions = prefix_len + self.offsets  # [B] n..n+B-1, also the block's cache slots
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for layer, weights, k_cache, v_cache in zip(self.draft.layers, self.weights, self.k_caches, self.v_caches):
            attn = layer.self_attn
            normed = fused_norm(layer.input_layernorm, hidden)
            q, k, v = F.linear(normed, weights.qkv).split([q_width, kv_width, kv_width], dim=-1)
            q = fused_norm(attn.q_norm, q.view(block, self.heads, self.head_dim))
            k = fused_norm(attn.k_norm, k.view(block, self.kv_heads, self.head_dim))
            q = rope_cache(q, k, v.view(block, self.kv_heads, self.head_dim), *self.rope, positions, k_cache, v_cache,
                           positions)  # [Hq, B, D]
            attended = tree_attention(q, k_cache, v_cache, prefix_len, self.sees_block, self.head_dim ** -0.5)
            attn_out = F.linear(attended.transpose(0, 1).reshape(block, -1), weights.o)  # [B, H]
            normed, hidden = fused_norm(layer.post_attention_layernorm, attn_out, hidden)
            gate_up = F.linear(normed, weights.gate_up)  # [B, 2I]
            hidden = hidden + F.linear(silu_mul(*gate_up.chunk(2, dim=-1)), weights.down)
        return self.head(fused_norm(self.draft.norm, hidden[1:]))  # [B - 1, Vd]


def dflash_runtime(draft: DFlashDraft, cfg: DFlashConfig, target_model) -> DFlashDrafter:
    return DFlashDrafter(draft, target_model)
