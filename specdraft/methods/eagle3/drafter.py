"""EAGLE-3 in the runtime: one draft KV cache of step-0 keys (specdraft.core.drafting); for a draft with an
attention window (method.attention_window, LongSpec) a ring of constant size (specdraft.layers.draft_cache)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from specdraft.core.drafting import Drafter
from specdraft.layers.decoder_parts import RuntimeWeights, fused_norm, layer_query, layer_tail
from specdraft.layers.draft_cache import (
    RingLayout,
    draft_attention,
    ingest_attention,
    ingest_slots,
    ring_commit,
    ring_ingest_attention,
    ring_visible_len,
    rope_tables,
    row_index,
)
from specdraft.methods.eagle3.config import Eagle3Config
from specdraft.methods.eagle3.model import Eagle3Draft


class Eagle3Drafter(Drafter):
    """The runtime's EAGLE-3 drafter (specdraft/core/drafting.py): one draft KV cache of step-0 keys.

    Column t of the confirmed prefix holds the keys of (fused target features at t, token t+1) at rotary
    position t, as TTT step 0 wrote them in training; a tree node at depth d (sequence position n + d) is
    TTT step d at column n - 1, so its rotary position is n - 1 + d and it sees the prefix plus its ancestors.

    A windowed draft whose window and sinks are shorter than `max_len` keeps them in a ring (`ring`, RingLayout):
    `visible_len` (min(prefix, held)) then takes the prefix's place in each drafting step, whose scratch slots
    follow the held ones; rotary positions stay the sequence's. Otherwise `ring` is None and `visible_len` is
    `prefix_len` itself.
    """

    def __init__(self, draft: Eagle3Draft, target_model):
        self.draft, self.embed_weight = draft, target_model.embed_tokens.weight  # [V, H]
        self.feature_layers, self.d2t = list(draft.feature_layers), draft.d2t
        attn = draft.midlayer.self_attn
        self.kv_heads, self.head_dim, self.theta = attn.kv_heads, attn.head_dim, attn.rope_theta

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        self.ring = ring_layout(self.draft, max_len, scratch)
        slots = max_len if self.ring is None else self.ring.slots
        self.k_cache = torch.zeros(self.kv_heads, slots, self.head_dim, device=device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope = rope_tables(max_len, self.head_dim, self.theta, device, self.draft.fc.weight.dtype)
        self.prefix_len = torch.zeros(1, dtype=torch.long, device=device)
        self.visible_len = self.prefix_len if self.ring is None else torch.zeros_like(self.prefix_len)
        self.last_hidden = torch.zeros(1, self.draft.fc.out_features, device=device, dtype=dtype)
        self.weights = RuntimeWeights.of(self.draft.midlayer)

    def state_tensors(self):
        ring = [] if self.ring is None else [self.visible_len]
        return [self.k_cache, self.v_cache, self.prefix_len, self.last_hidden, *ring]

    def query(self, hidden, tokens, rope_positions, slots, position_offset=0, slot_base=None, cache=None):
        """hidden [M, H]; tokens, rope_positions, slots [M] -> q [Hq, M, D] (at rope_positions + position_offset);
        writes their keys and values at slots (+ slot_base [1]) of the draft's cache (or of `cache`, (k, v))."""
        k_cache, v_cache = cache if cache is not None else (self.k_cache, self.v_cache)
        return layer_query(self.draft.midlayer, self.weights, hidden, tokens, self.embed_weight, self.rope,
                           rope_positions, k_cache, v_cache, slots, position_offset, slot_base)

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
        if self.ring is not None:
            return self.ingest_ring(hidden, next_tokens, start, count)
        positions = ingest_slots(start, next_tokens.shape[0], next_tokens.device)  # [M]
        cache_start, slots = (start, positions) if shift is None else (start - shift, positions - shift)
        q = self.query(hidden, next_tokens, positions, slots)
        _, hidden = self.tail(hidden, ingest_attention(q, self.k_cache, self.v_cache, cache_start))
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(cache_start, count, out=self.prefix_len)

    def ingest_ring(self, hidden, next_tokens, start, count) -> None:
        """`ingest` into the ring: the rows' keys projected aside ([Hkv, M, D]), their attention over the ring and
        themselves, then the rows the ring keeps written into it."""
        rows, device = next_tokens.shape[0], next_tokens.device
        new_k = self.k_cache.new_empty(self.kv_heads, rows, self.head_dim)
        new_v = torch.empty_like(new_k)
        q = self.query(hidden, next_tokens, ingest_slots(start, rows, device), row_index(rows, device),
                       cache=(new_k, new_v))
        attended = ring_ingest_attention(q, new_k, new_v, self.k_cache, self.v_cache, self.ring, start)
        _, hidden = self.tail(hidden, attended)
        ring_commit(self.ring, self.k_cache, self.v_cache, new_k, new_v, start, count)
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(start, count, out=self.prefix_len)
        ring_visible_len(self.ring, self.prefix_len, out=self.visible_len)

    def draft_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [k, H] (fused target features, or a fed-back state) as the decoder layer reads it: itself here."""
        return hidden

    def first(self, root_token, position):
        normed = fused_norm(self.draft.norm, self.last_hidden)
        return self.draft.lm_head(normed), normed if self.draft.norm_output else self.last_hidden

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        hidden = self.draft_input(hidden)
        q = self.query(hidden, tokens, positions, scratch_slots, position_offset=-1, slot_base=self.visible_len)
        attended = draft_attention(q, self.k_cache, self.v_cache, self.visible_len, scratch_visible,
                                   root_written=False)
        normed, out = self.tail(hidden, attended)
        return self.draft.lm_head(normed), normed if self.draft.norm_output else out  # the fed-back state


def ring_layout(draft: Eagle3Draft, max_len: int, scratch: int) -> Optional[RingLayout]:
    """The ring of a windowed draft (its window and sinks shorter than max_len), else None: a full cache."""
    window = draft.attention_window
    if window.size and window.sinks + window.size < max_len:
        return RingLayout(sinks=window.sinks, window=window.size, scratch=scratch)
    return None


def eagle3_runtime(draft: Eagle3Draft, cfg: Eagle3Config, target_model) -> Eagle3Drafter:
    return Eagle3Drafter(draft, target_model)
