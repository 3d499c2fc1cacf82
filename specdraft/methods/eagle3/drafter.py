"""EAGLE-3 in the runtime: one draft KV cache of step-0 keys (specdraft.core.drafting)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from specdraft.core.drafting import Drafter
from specdraft.layers.decoder_parts import RuntimeWeights, fused_norm, layer_query, layer_tail
from specdraft.layers.draft_cache import draft_attention, ingest_attention, ingest_slots, rope_tables
from specdraft.methods.eagle3.config import Eagle3Config
from specdraft.methods.eagle3.model import Eagle3Draft


class Eagle3Drafter(Drafter):
    """The runtime's EAGLE-3 drafter (specdraft/core/drafting.py): one draft KV cache of step-0 keys.

    Column t of the confirmed prefix holds the keys of (fused target features at t, token t+1) at rotary
    position t, as TTT step 0 wrote them in training; a tree node at depth d (sequence position n + d) is
    TTT step d at column n - 1, so its rotary position is n - 1 + d and it sees the prefix plus its ancestors.
    """

    def __init__(self, draft: Eagle3Draft, target_model):
        self.draft, self.embed_weight = draft, target_model.embed_tokens.weight  # [V, H]
        self.feature_layers, self.d2t = list(draft.feature_layers), draft.d2t
        attn = draft.midlayer.self_attn
        self.kv_heads, self.head_dim, self.theta = attn.kv_heads, attn.head_dim, attn.rope_theta

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        self.k_cache = torch.zeros(self.kv_heads, max_len, self.head_dim, device=device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope = rope_tables(max_len, self.head_dim, self.theta, device, self.draft.fc.weight.dtype)
        self.prefix_len = torch.zeros(1, dtype=torch.long, device=device)
        self.last_hidden = torch.zeros(1, self.draft.fc.out_features, device=device, dtype=dtype)
        self.weights = RuntimeWeights.of(self.draft.midlayer)

    def state_tensors(self):
        return [self.k_cache, self.v_cache, self.prefix_len, self.last_hidden]

    def query(self, hidden, tokens, rope_positions, slots, position_offset=0, slot_base=None):
        """hidden [M, H]; tokens, rope_positions, slots [M] -> q [Hq, M, D] (at rope_positions + position_offset);
        writes their keys and values at slots (+ slot_base [1])."""
        return layer_query(self.draft.midlayer, self.weights, hidden, tokens, self.embed_weight, self.rope,
                           rope_positions, self.k_cache, self.v_cache, slots, position_offset, slot_base)

    def tail(self, hidden, attended):
        """hidden [M, H], attended [Hq, M, D] (the attention's output) -> (the head's final norm of the midlayer's
        output, that output), each [M, H]."""
        attn_out = F.linear(attended.transpose(0, 1).reshape(hidden.shape[0], -1), self.weights.o)  # [M, H]
        return layer_tail(self.draft.midlayer, self.weights, self.draft.norm, hidden, attn_out)

    def ingest(self, features, next_tokens, start, count) -> None:
        self.ingest_shifted(features, next_tokens, start, count, None)

    @torch.no_grad()  # inference only: the last row goes through out=, which autograd refuses
    def ingest_shifted(self, features, next_tokens, start, count, shift: Optional[torch.Tensor]) -> None:
        """`ingest` with each row's keys at its target slot less `shift` [1] (None: at it), its rotary position the
        target's: for a drafter whose cache dropped some of the prompt's positions (ViSpec's image columns)."""
        aux = torch.cat([features[i] for i in self.feature_layers], dim=-1)  # [M, 3H]
        hidden = self.draft_input(self.draft.fuse(aux))  # [M, H]
        positions = ingest_slots(start, next_tokens.shape[0], next_tokens.device)  # [M]
        cache_start, slots = (start, positions) if shift is None else (start - shift, positions - shift)
        q = self.query(hidden, next_tokens, positions, slots)
        _, hidden = self.tail(hidden, ingest_attention(q, self.k_cache, self.v_cache, cache_start))
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(cache_start, count, out=self.prefix_len)

    def draft_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [k, H] (fused target features, or a fed-back state) as the decoder layer reads it: itself here."""
        return hidden

    def first(self, root_token, position):
        normed = fused_norm(self.draft.norm, self.last_hidden)
        return self.draft.lm_head(normed), normed if self.draft.norm_output else self.last_hidden

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        hidden = self.draft_input(hidden)
        q = self.query(hidden, tokens, positions, scratch_slots, position_offset=-1, slot_base=self.prefix_len)
        attended = draft_attention(q, self.k_cache, self.v_cache, self.prefix_len, scratch_visible, root_written=False)
        normed, out = self.tail(hidden, attended)
        return self.draft.lm_head(normed), normed if self.draft.norm_output else out  # the fed-back state


def eagle3_runtime(draft: Eagle3Draft, cfg: Eagle3Config, target_model) -> Eagle3Drafter:
    return Eagle3Drafter(draft, target_model)
