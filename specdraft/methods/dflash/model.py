"""The DFlash draft: `fc` + `hidden_norm` fuse the target's feature layers into one context state per confirmed
position; a stack of decoder layers runs over a block of token embeddings (the anchor's, then the mask token's),
each layer's queries and block keys from its own input, its context keys and values projected from the context
state (the same state for every layer), q and k normed per head (Qwen3-style); the final norm and an LM head (the
target's own, shared and frozen, or a trained head over a draft vocabulary). The layout follows z-lab's reference,
SGLang's and speculators', so that the exports load there without renaming."""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from specdraft.config import checkpointing_mode
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin
from specdraft.layers.blocks import swiglu
from specdraft.layers.cast import compute_weight
from specdraft.layers.compile import maybe_compiled
from specdraft.layers.zero import init_linear_normal_
from specdraft.methods.dflash.blocks import BlockMask, block_attention
from specdraft.methods.dflash.config import DFlashConfig, dflash_feature_layers, draft_vocab_size, mask_token_id
from specdraft.methods.shared import DraftVocab, GQAProjections


class DFlashAttention(GQAProjections):
    """GQA attention of a block's queries over [context ; block] keys, q and k RMS-normed per head."""

    def __init__(self, target: TargetInfo):
        super().__init__(target)
        self.q_norm = RMSNorm(self.head_dim, target.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, target.rms_norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:  # [B, T, heads*D] -> [B, heads, T, D]
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def keys(self, x: torch.Tensor, positions: torch.Tensor):
        """x [B, T, H] at rotary positions [B, T] -> rotated, normed keys and the values, [B, kvh, T, D] each."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        keys = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.kv_heads)), cos, sin)
        return keys, self._heads(self.v_proj(x), self.kv_heads)

    def forward(self, normed: torch.Tensor, positions: torch.Tensor, context_kv, mask: BlockMask) -> torch.Tensor:
        """normed [B, Q, H] (the layer's normed input) at positions [B, Q]; context_kv: the context's keys and
        values [B, kvh, T, D] -> [B, Q, H]."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, normed.dtype)
        query = apply_rope(self.q_norm(self._heads(self.q_proj(normed), self.heads)), cos, sin)  # [B, h, Q, D]
        block_keys, block_values = self.keys(normed, positions)
        keys = torch.cat([context_kv[0], block_keys], dim=2)  # [B, kvh, T + Q, D]
        values = torch.cat([context_kv[1], block_values], dim=2)
        attended = block_attention(query, keys, values, mask)  # [B, h, Q, D]
        return self.o_proj(attended.transpose(1, 2).reshape(*normed.shape[:2], -1))


def _mlp_residual(layer: "DFlashDecoderLayer", hidden: torch.Tensor) -> torch.Tensor:  # [B, Q, H] -> [B, Q, H]
    normed = layer.post_attention_layernorm(hidden)
    if layer.recompute_pointwise and torch.is_grad_enabled():  # keeps gate and up only, not silu(gate) * up
        mlp = layer.mlp
        gate_up = compute_weight(mlp.gate_proj.weight, mlp.up_proj.weight)  # [2I, H]
        return hidden + swiglu(normed, gate_up, compute_weight(mlp.down_proj.weight), recompute_pointwise=True)
    return hidden + layer.mlp(normed)


class DFlashDecoderLayer(nn.Module):
    """input_layernorm -> attention (block queries, context + block keys) -> residual -> post-attention norm ->
    SwiGLU -> residual. `compiled` (train.compile) runs the MLP residual under torch.compile; `recompute_pointwise`
    (activation checkpointing from swiglu on) recomputes the MLP's silu and product in the backward."""

    compiled = False
    recompute_pointwise = False

    def __init__(self, target: TargetInfo, intermediate_size: int):
        super().__init__()
        self.input_layernorm = RMSNorm(target.hidden_size, target.rms_norm_eps)
        self.self_attn = DFlashAttention(target)
        self.post_attention_layernorm = RMSNorm(target.hidden_size, target.rms_norm_eps)
        self.mlp = SwiGLU(target.hidden_size, intermediate_size)

    def forward(self, hidden, positions, context, context_positions, mask: BlockMask):
        """hidden [B, Q, H] at positions [B, Q]; context [B, T, H] (fused features) at context_positions [B, T]."""
        context_kv = self.self_attn.keys(context, context_positions)
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), positions, context_kv, mask)
        return maybe_compiled(_mlp_residual, self.compiled)(self, hidden)


class DFlashDraft(DraftVocab, nn.Module):
    """fc + hidden_norm (the context) -> num_layers decoder layers over the block -> norm -> LM head."""

    def __init__(self, cfg: DFlashConfig, ctx: DraftContext):
        super().__init__()
        target = ctx.target
        self.feature_layers = dflash_feature_layers(cfg, target)
        self.block_size, self.mask_token_id = cfg.block_size, mask_token_id(cfg, target)
        hidden = target.hidden_size
        self.fc = nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, target.rms_norm_eps)
        intermediate = cfg.intermediate_size or target.intermediate_size
        self.layers = nn.ModuleList(DFlashDecoderLayer(target, intermediate) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(hidden, target.rms_norm_eps)
        vocab = draft_vocab_size(cfg, target)
        self.lm_head = nn.Linear(hidden, vocab, bias=False) if vocab is not None else None
        self.activation_checkpointing = ctx.activation_checkpointing
        for layer in self.layers:
            layer.compiled = bool(ctx.compile)
            layer.recompute_pointwise = checkpointing_mode(ctx.activation_checkpointing) != "none"
        if vocab is not None:
            self.init_draft_vocab(ctx.token_counts, vocab, target.vocab_size)
        else:  # the target's vocabulary: identity maps, never saved (the layouts of SGLang and vLLM carry none)
            device = torch.get_default_device()
            self.register_buffer("d2t", torch.zeros(target.vocab_size, dtype=torch.long, device=device),
                                 persistent=False)
            self.register_buffer("t2d", torch.ones(target.vocab_size, dtype=torch.bool, device=device),
                                 persistent=False)
        init_linear_normal_(self, cfg.init_std)

    @property
    def shares_target_head(self) -> bool:
        """Whether the LM head is the target's own (frozen, not part of this module)."""
        return self.lm_head is None

    def context(self, hidden_states: Dict[int, torch.Tensor]) -> torch.Tensor:
        """The feature layers' hidden states {i: [B, T, H]} -> the fused context [B, T, H]."""
        aux = torch.cat([hidden_states[i] for i in self.feature_layers], dim=-1)  # [B, T, nH]
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def blocks(self, embeds: torch.Tensor, positions: torch.Tensor, context: torch.Tensor,
               context_positions: torch.Tensor, mask: BlockMask) -> torch.Tensor:
        """embeds [B, Q, H] (each block: the anchor's embedding, then the mask token's) at positions [B, Q]
        -> the final norm of the last layer's states [B, Q, H]. Activation checkpointing (selective or full)
        recomputes each layer in the backward."""
        hidden = embeds.to(context.dtype)
        full = checkpointing_mode(self.activation_checkpointing) in ("selective", "full") and torch.is_grad_enabled()
        for layer in self.layers:
            if full:
                hidden = checkpoint(layer, hidden, positions, context, context_positions, mask, use_reentrant=False)
            else:
                hidden = layer(hidden, positions, context, context_positions, mask)
        return self.norm(hidden)

    def logits(self, normed: torch.Tensor, target_lm_head: Optional[torch.Tensor] = None) -> torch.Tensor:
        """normed [..., H] -> [..., Vd]: the trained head, or the target's LM head weight [V, H] when shared."""
        if self.lm_head is not None:
            return self.lm_head(normed)
        return F.linear(normed, target_lm_head.to(normed.dtype))
