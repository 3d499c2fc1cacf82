"""ViSpec in the runtime: EAGLE-3's drafter (specdraft.methods.eagle3.drafter) over the draft's own sequence.

`begin` reads the prompt's image context (IMAGE_EMBEDS [P, H], IMAGE_MASK [P]), runs the image adaptor, and fills
tables indexed by the target's cache slot, so that `ingest` (captured in CUDA graphs) reads them with static
shapes: each slot's column in the draft's cache (dropped image columns go to a slot no one reads, `trash`; slots
past the prompt shift down by the columns the images dropped), its stand-in and whether it has one, and its global
feature. Rotary positions stay the target's. Each drafting step reads the last image's global
feature through img_fc. A prompt without images (no context) drafts as EAGLE-3 does with zero global features.
"""
from __future__ import annotations

from typing import Mapping

import torch

from specdraft.core.drafting import DrafterCaps
from specdraft.core.types import IMAGE_EMBEDS, IMAGE_MASK
from specdraft.kernels.tree_attention import tree_attention
from specdraft.layers.draft_cache import ingest_slots
from specdraft.methods.eagle3 import Eagle3Drafter
from specdraft.methods.vispec.config import VispecConfig
from specdraft.methods.vispec.model import VispecDraft, image_inputs


class VispecDrafter(Eagle3Drafter):
    """The runtime's ViSpec drafter: EAGLE-3's over a draft cache whose columns are the draft's sequence."""

    caps = DrafterCaps(context=(IMAGE_EMBEDS, IMAGE_MASK))

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        super().allocate(max_len + 1, scratch, device, dtype)  # one more slot: `trash`
        self.trash, hidden = max_len, self.draft.fc.out_features
        self.slots = torch.arange(max_len + 1, device=device)  # [S] target slot -> draft cache slot
        self.standin = torch.zeros(max_len + 1, hidden, device=device, dtype=dtype)  # [S, H]
        self.is_standin = torch.zeros(max_len + 1, dtype=torch.bool, device=device)  # [S]
        self.global_features = torch.zeros(max_len + 1, hidden, device=device, dtype=dtype)  # [S, H]
        self.last_global = torch.zeros(1, hidden, device=device, dtype=dtype)  # [1, H]: what drafting steps read

    @torch.no_grad()
    def begin(self, context: Mapping[str, torch.Tensor]) -> None:
        """The prompt's images into the per-slot tables (outside CUDA graphs: once per prompt)."""
        if not context:  # a prompt without images
            self.slots.copy_(torch.arange(self.slots.shape[0], device=self.slots.device))
            for table in (self.standin, self.is_standin, self.global_features, self.last_global):
                table.zero_()
            return
        super().begin(context)
        embeds, mask = context[IMAGE_EMBEDS], context[IMAGE_MASK].bool()  # [P, H], [P]
        maps, standins, global_features = image_inputs(self.draft, embeds[None], mask[None])
        prompt_len, kept = mask.shape[0], maps.kept[0]
        shift = prompt_len - int(kept.sum())
        draft_slot = torch.where(kept, kept.long().cumsum(0) - 1, torch.full_like(mask, self.trash, dtype=torch.long))
        after = torch.arange(prompt_len, self.slots.shape[0], device=mask.device) - shift
        self.slots.copy_(torch.cat([draft_slot, after]))
        last = global_features[0, -1:] if bool(maps.global_feature[0, -1] >= 0) else torch.zeros_like(self.last_global)
        self.last_global.copy_(last)
        self.standin.zero_()
        self.standin[:prompt_len] = standins[0]
        self.is_standin.zero_()
        self.is_standin[:prompt_len] = maps.standin[0] >= 0
        self.global_features.copy_(self.last_global.expand_as(self.global_features))
        self.global_features[:prompt_len] = global_features[0]

    @torch.no_grad()  # inference only: the last row goes through out=, which autograd refuses
    def ingest(self, features, next_tokens, start, count) -> None:
        aux = torch.cat([features[i] for i in self.feature_layers], dim=-1)  # [M, 3H]
        fused = self.draft.fc(aux.to(self.draft.fc.weight.dtype))  # [M, H]
        rows = ingest_slots(start, next_tokens.shape[0], next_tokens.device)  # [M] target slots (rotary positions)
        hidden = self.draft.with_image(fused, self.global_features[rows])
        hidden = torch.where(self.is_standin[rows, None], self.standin[rows].to(hidden.dtype), hidden)  # [M, H]
        slots = self.slots[rows]  # [M] draft cache slots (trash for dropped image positions)
        window = slots.min().view(1)  # [1] the first row's slot: the rows' slots run from here, in order
        q = self.query(hidden, next_tokens, rows, slots)
        visible = (window + torch.arange(rows.shape[0], device=rows.device)) <= slots[:, None]  # [M, M]
        attended = tree_attention(q, self.k_cache, self.v_cache, window, visible, q.shape[-1] ** -0.5)
        _, hidden = self.tail(hidden, attended)
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(torch.index_select(slots, 0, count - 1), 1, out=self.prefix_len)

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        hidden = self.draft.with_image(hidden, self.last_global.expand_as(hidden))
        return super().step(depth, hidden, tokens, positions, scratch_slots, scratch_visible)


def vispec_runtime(draft: VispecDraft, cfg: VispecConfig, target_model) -> VispecDrafter:
    return VispecDrafter(draft, target_model)
