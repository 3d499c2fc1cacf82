"""ViSpec in the runtime: EAGLE-3's drafter (specdraft.methods.eagle3.drafter) over the draft's own sequence.

`begin` reads the prompt's image context (IMAGE_EMBEDS [P, H], IMAGE_MASK [P]), runs the image adaptor, and fills
tables indexed by the target's cache slot, so that `ingest_prompt` (captured in CUDA graphs) reads them with static
shapes: each slot's column in the draft's cache (dropped image columns go to a slot no one reads, `trash`), its
stand-in and whether it has one, and its global feature. Rotary positions stay the target's.

Every row after the prompt is text that reads the last image's global feature g, at its target slot less the
columns the images dropped (`shift`): a cycle's `ingest` is EAGLE-3's with those slots, and img_fc, split as
img_fc([h; g]) = W_h h + W_g g, is one matmul onto W_g g (`global_term`, made once a prompt), there and at each
drafting step. A prompt without images (no context) drafts as EAGLE-3 does with zero global features.
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from specdraft.core.drafting import DrafterCaps
from specdraft.core.errors import SpecdraftError
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
        self.shift = torch.zeros(1, dtype=torch.long, device=device)  # [1] the columns the prompt's images dropped
        weight = self.draft.img_fc.weight.detach()  # [H, 2H] = [W_h | W_g]
        self.global_term = torch.zeros(1, hidden, device=device, dtype=weight.dtype)  # [1, H] W_g g, the last image
        self.hidden_weight_t = weight[:, :hidden].t().contiguous()  # [H, H] W_h transposed, for addmm
        self.global_weight = weight[:, hidden:]  # [H, H] W_g

    @torch.no_grad()
    def begin(self, context: Mapping[str, torch.Tensor]) -> None:
        """The prompt's images into the per-slot tables (outside CUDA graphs: once per prompt)."""
        if not context:  # a prompt without images
            self.slots.copy_(torch.arange(self.slots.shape[0], device=self.slots.device))
            for table in (self.standin, self.is_standin, self.global_features, self.shift, self.global_term):
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
        self.shift.fill_(shift)
        has_image = bool(maps.global_feature[0, -1] >= 0)
        last_global = global_features[0, -1:] if has_image else torch.zeros_like(self.global_term)  # [1, H]
        self.global_term.copy_(F.linear(last_global.to(self.global_weight.dtype), self.global_weight))
        self.standin.zero_()
        self.standin[:prompt_len] = standins[0]
        self.is_standin.zero_()
        self.is_standin[:prompt_len] = maps.standin[0] >= 0
        self.global_features.copy_(last_global.expand_as(self.global_features))  # every row after the prompt: g
        self.global_features[:prompt_len] = global_features[0]

    @torch.no_grad()  # inference only: the last row goes through out=, which autograd refuses
    def ingest_prompt(self, features, next_tokens, start, count) -> None:
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

    def ingest(self, features, next_tokens, start, count) -> None:
        """Rows after the prompt: text, each at its target slot less `shift` (module docstring)."""
        self.ingest_shifted(features, next_tokens, start, count, self.shift)

    def draft_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """img_fc of hidden [k, H] rows after every image: W_h h + W_g g in one launch -> [k, H]."""
        return torch.addmm(self.global_term, hidden, self.hidden_weight_t)


def vispec_runtime(draft: VispecDraft, cfg: VispecConfig, target_model) -> VispecDrafter:
    if cfg.attention_window:  # its cache maps image columns by slot: EAGLE-3's ring does not hold them
        raise SpecdraftError(f"ViSpec's runtime drafter keeps a full draft cache: this draft's method.attention_window "
                             f"{cfg.attention_window} is served by eagle3 and poss drafts only (0: full attention)")
    return VispecDrafter(draft, target_model)
