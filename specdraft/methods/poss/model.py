"""PosS's head: EAGLE-3's with one decoder layer a band of draft positions, and the step-0 keys each specialist
writes over a confirmed prefix (the package docstring says which keys a specialist attends to)."""
from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from specdraft.core.types import DraftContext
from specdraft.layers import apply_rope, rope_cos_sin
from specdraft.layers.zero import init_linear_normal_
from specdraft.methods.eagle3 import KV, Eagle3DecoderLayer, Eagle3Draft
from specdraft.methods.poss.config import PossConfig


class PossDraft(Eagle3Draft):
    """EAGLE-3's head with `specialists` (one Eagle3DecoderLayer each) in place of its single `midlayer`."""

    def __init__(self, cfg: PossConfig, ctx: DraftContext):
        super().__init__(cfg, ctx)
        first = self._modules.pop("midlayer")  # EAGLE-3's layer becomes specialist 0
        width = first.mlp.gate_proj.out_features
        others = [Eagle3DecoderLayer(ctx.target, width) for _ in range(cfg.num_specialists - 1)]
        init_linear_normal_(nn.ModuleList(others), cfg.init_std)  # gathers ZeRO-3 partitions (zero.Init)
        self.specialists = nn.ModuleList([first, *others])
        self.positions_per_specialist = cfg.positions_per_specialist
        self.share_attention_window()

    @property
    def midlayer(self) -> Eagle3DecoderLayer:
        """Specialist 0, under the name EAGLE-3's helpers (the export config) use."""
        return self.specialists[0]

    def specialist_for(self, step: int) -> int:
        """The specialist that runs TTT step `step` (which drafts the token at depth step + 1)."""
        return min(step // self.positions_per_specialist, len(self.specialists) - 1)

    def step(self, hidden, embeds, positions, query_cols, cache, mask=None, specialist: int = 0, weights_for=None):
        """One draft step through `specialist`: hidden, embeds [B, Tq, H] -> new hidden [B, Tq, H], this KV."""
        return self.specialists[specialist](hidden, embeds, positions=positions, query_cols=query_cols, cache=cache,
                                            mask=mask, weights_for=weights_for)  # keywords: Eagle3Draft.step


def specialist_prefix_kv(layer: Eagle3DecoderLayer, fused: torch.Tensor, embeds: torch.Tensor,
                         positions: torch.Tensor) -> KV:
    """The step-0 keys and values `layer` would write, without its attention or MLP.

    fused, embeds [B, T, H] (fused features at t, embedding of token t+1); positions [T] or [B, T] -> keys and
    values [B, kvh, T, D].
    Mirrors Eagle3DecoderLayer/Eagle3Attention up to the projections (tests compare the two)."""
    attn = layer.self_attn
    attn_in = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(fused)], dim=-1)  # [B, T, 2H]
    cos, sin = rope_cos_sin(positions, attn.head_dim, attn.rope_theta, attn_in.dtype)
    batch, length = attn_in.shape[:2]
    keys = attn.k_proj(attn_in).view(batch, length, attn.kv_heads, attn.head_dim).transpose(1, 2)
    values = attn.v_proj(attn_in).view(batch, length, attn.kv_heads, attn.head_dim).transpose(1, 2)
    return apply_rope(keys, cos, sin), values


class PrefixKeys:
    """Each specialist's step-0 keys over one prefix, projected the first time that specialist is needed."""

    def __init__(self, draft: PossDraft, fused: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor):
        self.draft, self.fused, self.embeds, self.positions = draft, fused, embeds, positions
        self.by_specialist: Dict[int, KV] = {}

    def __getitem__(self, specialist: int) -> KV:
        if specialist not in self.by_specialist:
            layer = self.draft.specialists[specialist]
            self.by_specialist[specialist] = specialist_prefix_kv(layer, self.fused, self.embeds, self.positions)
        return self.by_specialist[specialist]
