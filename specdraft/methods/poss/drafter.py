"""PosS's runtime drafter: EAGLE-3's with one KV cache per specialist."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdraft.core.drafting import Drafter
from specdraft.layers.decoder_parts import RuntimeWeights, fused_norm, layer_query, layer_tail
from specdraft.layers.draft_cache import (
    draft_attention,
    ingest_attention,
    ingest_slots,
    ring_commit,
    ring_ingest_attention,
    ring_visible_len,
    rope_tables,
    row_index,
)
from specdraft.methods.eagle3.drafter import ring_layout
from specdraft.methods.poss.config import PossConfig
from specdraft.methods.poss.model import PossDraft


class PossDrafter(Drafter):
    """The runtime's PosS drafter (specdraft/core/drafting.py), EAGLE-3's (eagle3.Eagle3Drafter) with one
    KV cache per specialist: [S, Hkv, max_len, D].

    Confirmed slots: each specialist's own step-0 keys (`ingest` projects them for every specialist, and runs
    specialist 0 whole for the depth-1 distribution). Scratch slots: the drafted chain, shared: the keys a
    depth's specialist writes go into every specialist's cache, so the next specialist attends to them as in
    training. A depth is one batched call through one specialist (`step`'s depth is a Python int). A windowed
    draft keeps rings, as EAGLE-3's drafter does (eagle3.Eagle3Drafter).
    """

    def __init__(self, draft: PossDraft, target_model):
        self.draft, self.embed_weight = draft, target_model.embed_tokens.weight  # [V, H]
        self.feature_layers, self.d2t = list(draft.feature_layers), draft.d2t
        attn = draft.specialists[0].self_attn
        self.kv_heads, self.head_dim, self.theta = attn.kv_heads, attn.head_dim, attn.rope_theta

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        self.ring = ring_layout(self.draft, max_len, scratch)
        slots = max_len if self.ring is None else self.ring.slots
        shape = (len(self.draft.specialists), self.kv_heads, slots, self.head_dim)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope = rope_tables(max_len, self.head_dim, self.theta, device, self.draft.fc.weight.dtype)
        self.prefix_len = torch.zeros(1, dtype=torch.long, device=device)
        self.visible_len = self.prefix_len if self.ring is None else torch.zeros_like(self.prefix_len)
        self.last_hidden = torch.zeros(1, self.draft.fc.out_features, device=device, dtype=dtype)
        self.weights = [RuntimeWeights.of(layer) for layer in self.draft.specialists]

    def state_tensors(self):
        ring = [] if self.ring is None else [self.visible_len]
        return [self.k_cache, self.v_cache, self.prefix_len, self.last_hidden, *ring]

    def _project(self, specialist: int, hidden, tokens, rope_positions, k_cache, v_cache, slots, position_offset=0,
                 slot_base=None):
        """hidden [M, H]; tokens, rope_positions, slots [M] -> q [Hq, M, D] of `specialist` (at rope_positions +
        position_offset); writes its keys and values at the slots (+ slot_base [1]) of k_cache, v_cache ([Hkv, S,
        D], or [C, Hkv, S, D]: into every specialist's)."""
        return layer_query(self.draft.specialists[specialist], self.weights[specialist], hidden, tokens,
                           self.embed_weight, self.rope, rope_positions, k_cache, v_cache, slots, position_offset,
                           slot_base)

    def _tail(self, specialist: int, hidden, attended):
        """hidden [M, H], attended [Hq, M, D] (the specialist's attention output) -> (the head's final norm of the
        specialist's output, the output), each [M, H]."""
        weights = self.weights[specialist]
        attn_out = F.linear(attended.transpose(0, 1).reshape(hidden.shape[0], -1), weights.o)  # [M, H]
        return layer_tail(self.draft.specialists[specialist], weights, self.draft.norm, hidden, attn_out)

    @torch.no_grad()  # inference only: the last row goes through out=, which autograd refuses
    def ingest(self, features, next_tokens, start, count) -> None:
        m, device = next_tokens.shape[0], next_tokens.device
        aux = torch.cat([features[i] for i in self.feature_layers], dim=-1)  # [M, 3H]
        fused = self.draft.fc(aux.to(self.draft.fc.weight.dtype))  # [M, H]
        columns = ingest_slots(start, m, device)  # [M]
        if self.ring is not None:
            return self._ingest_ring(fused, next_tokens, columns, start, count)
        for specialist in reversed(range(len(self.draft.specialists))):  # ends with specialist 0's queries
            q = self._project(specialist, fused, next_tokens, columns, self.k_cache[specialist],
                              self.v_cache[specialist], columns)
        _, hidden = self._tail(0, fused, ingest_attention(q, self.k_cache[0], self.v_cache[0], start))
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(start, count, out=self.prefix_len)

    def _ingest_ring(self, fused, next_tokens, columns, start, count) -> None:
        """`ingest` into the specialists' rings: each one's keys projected aside, specialist 0's attention over its
        ring and the rows (before any ring changes), then the kept rows into every ring."""
        rows, device = next_tokens.shape[0], next_tokens.device
        for specialist in reversed(range(len(self.draft.specialists))):  # ends with specialist 0's queries
            new_k = self.k_cache.new_empty(self.kv_heads, rows, self.head_dim)
            new_v = torch.empty_like(new_k)
            q = self._project(specialist, fused, next_tokens, columns, new_k, new_v, row_index(rows, device))
            if specialist == 0:
                attended = ring_ingest_attention(q, new_k, new_v, self.k_cache[0], self.v_cache[0], self.ring, start)
            ring_commit(self.ring, self.k_cache[specialist], self.v_cache[specialist], new_k, new_v, start, count)
        _, hidden = self._tail(0, fused, attended)
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(start, count, out=self.prefix_len)
        ring_visible_len(self.ring, self.prefix_len, out=self.visible_len)

    def first(self, root_token, position):
        return self.draft.lm_head(fused_norm(self.draft.norm, self.last_hidden)), self.last_hidden

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        specialist = self.draft.specialist_for(depth)  # TTT step `depth` drafts depth + 1
        q = self._project(specialist, hidden, tokens, positions, self.k_cache, self.v_cache, scratch_slots,
                          position_offset=-1, slot_base=self.visible_len)  # every specialist sees the chain
        attended = draft_attention(q, self.k_cache[specialist], self.v_cache[specialist], self.visible_len,
                                   scratch_visible, root_written=False)
        normed, out = self._tail(specialist, hidden, attended)
        return self.draft.lm_head(normed), out


def poss_runtime(draft: PossDraft, cfg: PossConfig, target_model) -> PossDrafter:
    return PossDrafter(draft, target_model)
