"""A separate small model of the target's tokenizer as the drafter (`DraftModelDrafter`): what Hugging Face's
assisted generation calls an assistant model, the baseline a trained draft head is measured against.

The small model is a second `VerifierModel` with a static KV cache of its own, its slots aligned with the target's
(slot p holds position p). It drafts one token a pass: `step` runs the frontier's k tokens at their scratch slots (a
chain: one row that sees every slot before its own, its ancestors; a tree: k rows under the scratch mask, each
seeing the confirmed prefix and its own ancestors, through `run_layers_at`), and its logits cover the target's
vocabulary (d2t zero: draft index i is target id i).

`ingest` catches the cache up with the confirmed tokens and runs the new root too: the cycle's rows are the old root
(the previous ingest's new root), the accepted tokens and the bonus token (the new root), one pass of count + 1 rows
at slots start..start+count under causal attention, padded to a static count. It rewrites what drafting left in
those slots (a tree's accepted nodes sit at scattered scratch slots; a chain's are in place, but its deepest draft
never ran) and leaves the root's keys at scratch slot 0 and its logits for `first`, which runs nothing: a cycle of
depth D costs the catch-up pass and D - 1 steps, each about one row's time on a small model. A cycle that drafted
without the model (a retrieval draft) is caught up the same way. The prompt's first token, which no ingest row
holds, comes in through `begin` (`PROMPT_IDS`).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import torch

from specdraft.core.drafting import PROMPT_IDS, Drafter, DrafterCaps
from specdraft.kernels.tree_attention import visible_slots
from specdraft.decoding.verifier import VerifierModel


def step_weights(model: VerifierModel) -> int:
    """The weights one pass of `model` multiplies by: its layers' and its LM head's (the embedding is a lookup)."""
    head = model.lm_head_weight.numel()
    return sum(p.numel() for p in model.layers.parameters()) + head


def cost_in_target_layers(draft: VerifierModel, target: VerifierModel) -> float:
    """One draft pass's cost in target-layer equivalents (`DrafterCaps.draft_cost_layers`): its weights over one
    target layer's, as a memory-bound decode step reads them."""
    per_layer = sum(p.numel() for p in target.layers.parameters()) / max(1, target.info.num_layers)
    return step_weights(draft) / max(1.0, per_layer)


class DraftModelDrafter(Drafter):
    """A small model of the target's tokenizer drafting for it (module docstring). `rope_tables` (cos, sin)
    [max_len, D]: the small model's own; `vocab_size`: the target's (a draft whose embedding has more rows, padding
    of the same tokenizer, drafts over the target's alone); `cost_layers`: its pass's cost in target layers."""

    def __init__(self, model: VerifierModel, rope_tables, vocab_size: int, cost_layers: float = 1.0):
        self.model, self.rope_tables = model, rope_tables
        self.vocab_size = min(model.info.vocab_size, vocab_size)
        self.clamp_ids = model.info.vocab_size < vocab_size  # an id past its embedding reads its last row
        self.feature_layers: List[int] = []  # it reads tokens, none of the target's states
        self.d2t = torch.zeros(self.vocab_size, dtype=torch.long, device=model.device)
        self.caps = DrafterCaps(draft_cost_layers=cost_layers, context=(PROMPT_IDS,))

    def allocate(self, max_len: int, scratch: int, device: torch.device, dtype: torch.dtype) -> None:
        self.model.allocate(max_len, *self.rope_tables)
        long = dict(dtype=torch.long, device=device)
        self.first_token = torch.zeros(1, **long)  # the prompt's first token (`begin`)
        self.root_token = torch.zeros(1, **long)  # the newest confirmed token: the next ingest's first row
        self.root_logits = torch.zeros(1, self.vocab_size, device=device, dtype=self.model.dtype)  # [1, V]
        self.root_hidden = torch.zeros(1, self.model.info.hidden_size, device=device, dtype=self.model.dtype)
        self.one = torch.ones(1, 1, dtype=torch.bool, device=device)  # a chain step sees itself
        self.d2t = self.d2t.to(device)

    def state_tensors(self) -> List[torch.Tensor]:
        return [self.model.k_cache, self.model.v_cache, self.root_token, self.root_logits, self.root_hidden]

    def begin(self, context: Mapping[str, torch.Tensor]) -> None:
        super().begin(context)
        self.first_token.copy_(context[PROMPT_IDS][:1])

    @torch.no_grad()
    def ingest_prompt(self, features: Dict[int, torch.Tensor], next_tokens: torch.Tensor, start: torch.Tensor,
                      count: torch.Tensor) -> None:
        """The prompt (its first token, then next_tokens: the rest and the root) from slot 0, causal."""
        rows = min(next_tokens.shape[0] + 1, self.model.max_len)  # a prompt padded to the whole cache: no room
        self._catch_up(torch.cat([self.first_token, next_tokens[:rows - 1]]), start, count, prefill=True)

    @torch.no_grad()
    def ingest(self, features: Dict[int, torch.Tensor], next_tokens: torch.Tensor, start: torch.Tensor,
               count: torch.Tensor) -> None:
        self._catch_up(torch.cat([self.root_token, next_tokens]), start, count, prefill=False)

    def _catch_up(self, tokens: torch.Tensor, start: torch.Tensor, count: torch.Tensor, prefill: bool) -> None:
        """tokens [R]: the confirmed tokens from slot start [1] on, row `count` the new root, rows past it padding
        -> their keys and values written from slot start, the root's logits and state kept for `first`."""
        model, rows = self.model, tokens.shape[0]
        start = start.clamp(max=model.max_len - rows)  # never a write past the cache (the engine keeps room)
        index = torch.arange(rows, device=tokens.device)  # [R]
        mask = None if prefill else index[:, None] >= index[None, :]  # None: the prefill's causal pass from slot 0
        hidden, _ = model.run_layers(self._embed(tokens), start + index, start, mask)  # [R, H]
        root_row = count.clamp(max=rows - 1)  # [1]
        root_hidden = hidden.index_select(0, root_row)  # [1, H]
        self.root_hidden.copy_(root_hidden)
        self.root_logits.copy_(self._logits(root_hidden))
        self.root_token.copy_(tokens.index_select(0, root_row))

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [k] (target ids) -> the small model's embeddings [k, H]."""
        return self.model.embed(tokens.clamp(max=self.model.info.vocab_size - 1) if self.clamp_ids else tokens)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [k, H] -> the small model's logits over the target's vocabulary [k, V]."""
        logits = self.model.logits(hidden)
        return logits if logits.shape[1] == self.vocab_size else logits[:, :self.vocab_size]

    def first(self, root_token: torch.Tensor, position: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.root_logits, self.root_hidden

    @torch.no_grad()
    def step(self, depth: int, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             scratch_slots: torch.Tensor, scratch_visible: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The frontier's k tokens at their scratch slots; `hidden` (the parents' states) is not read: the small
        model's cache holds the ancestors."""
        model = self.model
        prefix = positions[:1] - depth  # [1] the root's slot: position n + depth is at depth `depth`
        slots = prefix + scratch_slots  # [k]
        embeds = self._embed(tokens)  # [k, H]
        if tokens.shape[0] == 1:  # a chain: every scratch slot before its own is an ancestor
            out, _ = model.run_layers(embeds, positions, slots, self.one)
        else:
            mask = visible_slots(prefix, scratch_visible, model.max_len)  # [k, S]
            out, _ = model.run_layers_at(embeds, positions, slots, mask, model.info.num_layers)
        return self._logits(out), out
