"""Kangaroo's adapter (one attention block over the target's shallow states, scored by the target's own final norm
and LM head) and how it is handed those target parts (`kangaroo_bind`)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext
from specdraft.layers import RMSNorm, apply_rope, repeat_kv, rope_cos_sin
from specdraft.layers.zero import init_linear_normal_
from specdraft.methods.kangaroo.config import KangarooConfig, kangaroo_exit_layer
from specdraft.methods.shared import DraftVocab, GQAProjections

KV = Tuple[torch.Tensor, torch.Tensor]  # keys, values: [B, kv_heads, T, D]


class AdapterAttention(GQAProjections):
    """Causal GQA attention with the target's head geometry and rotary positions, over an optional KV cache."""

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:  # [B, T, heads*D] -> [B, heads, T, D]
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Optional[KV]) -> Tuple[torch.Tensor, KV]:
        """x [B, T, H] at positions [T], after the cached positions -> [B, T, H] and the KV of cache + these T."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        queries = apply_rope(self._split(self.q_proj(x), self.heads), cos, sin)  # [B, h, T, D]
        keys = apply_rope(self._split(self.k_proj(x), self.kv_heads), cos, sin)  # [B, kvh, T, D]
        values = self._split(self.v_proj(x), self.kv_heads)
        if cache is not None:
            keys, values = torch.cat([cache[0], keys], dim=2), torch.cat([cache[1], values], dim=2)
        past = keys.shape[2] - x.shape[1]
        query_pos = torch.arange(x.shape[1], device=x.device) + past
        visible = torch.arange(keys.shape[2], device=x.device)[None, :] <= query_pos[:, None]  # [T, past + T]
        groups = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(queries, repeat_kv(keys, groups), repeat_kv(values, groups),
                                             attn_mask=visible)  # [B, h, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1)), (keys, values)


class KangarooDraft(DraftVocab, nn.Module):
    """The adapter: shallow [B, T, H] -> shallow + attention(norm(shallow)), scored by the target's head."""

    def __init__(self, cfg: KangarooConfig, ctx: DraftContext):
        super().__init__()
        target = ctx.target
        self.exit_layer = kangaroo_exit_layer(cfg, target)
        self.feature_layers = [self.exit_layer]
        self.input_layernorm = RMSNorm(target.hidden_size, target.rms_norm_eps)
        self.self_attn = AdapterAttention(target)
        init_linear_normal_(self.self_attn, cfg.init_std)  # gathers ZeRO-3 partitions: zero.Init split them
        vocab = min(cfg.draft_vocab_size or target.vocab_size, target.vocab_size)
        self.init_draft_vocab(ctx.token_counts, vocab, target.vocab_size)
        object.__setattr__(self, "target_model", None)  # bound by `bind_target`; never a submodule

    def forward(self, shallow: torch.Tensor, positions: torch.Tensor, cache: Optional[KV] = None):
        """shallow [B, T, H] target states at ℓ, positions [T] -> adapter output [B, T, H] (pre-norm), KV."""
        attn_out, kv = self.self_attn(self.input_layernorm(shallow), positions, cache)
        return shallow + attn_out, kv

    def head_rows(self, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """The target's LM head [V, H] -> the draft vocabulary's rows [Vd, H] (the weight itself if Vd = V)."""
        if self.d2t.shape[0] == lm_head_weight.shape[0]:
            return lm_head_weight
        return lm_head_weight[self.draft_ids().to(lm_head_weight.device)]

    def logits(self, hidden: torch.Tensor, final_norm, head_rows: torch.Tensor) -> torch.Tensor:
        """hidden [.., H] -> [.., Vd] through the target's final norm and LM head rows [Vd, H]."""
        normed = final_norm(hidden)
        return F.linear(normed, head_rows.to(normed.dtype))

    def target_logits_fn(self):
        """hidden [.., H] -> [.., Vd] through the bound Hugging Face target's final norm and LM head."""
        model = self.target_model
        if model is None:
            raise SpecdraftError("the Kangaroo adapter has no target bound (spec.bind_target(draft, target_model))")
        head = self.head_rows(model.get_output_embeddings().weight)
        return lambda hidden: self.logits(hidden, model.get_decoder().norm, head)


def kangaroo_bind(draft: KangarooDraft, target_model: Optional[nn.Module]) -> None:
    if target_model is None:  # offline or hybrid features: the trainer holds no target model
        raise SpecdraftError("Kangaroo trains with data.features=online: its draft runs the target's final norm "
                             "and LM head, which stored features do not keep")
    head_and_norm = [target_model.get_output_embeddings().weight, target_model.get_decoder().norm.weight]
    if any(hasattr(weight, "ds_id") for weight in head_and_norm):  # partitioned: empty outside the target's forward
        raise SpecdraftError("Kangaroo's draft runs the target's final norm and LM head outside the target's forward, "
                             "which a ZeRO-3 partitioned target does not allow: set train.shard_target=false")
    object.__setattr__(draft, "target_model", target_model)
