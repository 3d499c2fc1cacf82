"""P-EAGLE in the runtime: a block drafter (core/drafting.py's `block_size` contract) on EAGLE-3's drafter (one
draft KV cache of step-0 keys, the same ingest) whose K = num_depths proposals come out of one `propose`.

Row 0 is depth 1, EAGLE-3's first token: the LM head over the ingest's last output (column n - 1, which read the
root x_n). Rows 1..K-1 are depths 2..K, one forward of K - 1 mask rows: the mask row of depth d + 1 (d = 1..K-1)
reads the mask token's embedding and mask_hidden through fc, stands at rotary position n - 1 + d (the prefix's last
column plus d, as training's group d does) with its KV at slot n + d (the drafter's scratch past the prefix, which the
next ingest overwrites), and attends to the confirmed prefix and to the mask rows before it, never to a drafted
token. The engine's `BlockCycle` builds the chain or block tree of those rows and verifies it.
"""
from __future__ import annotations

import torch

from specdraft.core.drafting import DrafterCaps
from specdraft.layers.decoder_parts import fused_norm
from specdraft.layers.draft_cache import draft_attention
from specdraft.methods.eagle3 import Eagle3Drafter
from specdraft.methods.peagle.config import PEagleConfig
from specdraft.methods.peagle.model import PEagleDraft


class PEagleDrafter(Eagle3Drafter):
    """The runtime's P-EAGLE drafter: `ingest` as EAGLE-3's, `propose` drafts the K depths in one forward."""

    def __init__(self, draft: PEagleDraft, target_model):
        super().__init__(draft, target_model)
        self.num_depths, self.mask_token_id = draft.num_depths, draft.mask_token_id
        self.caps = DrafterCaps(block_size=draft.num_depths + 1)  # the root and the K depths drafted after it

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        super().allocate(max_len + self.num_depths, scratch, device, dtype)  # the mask rows' slots past any prefix
        rows = self.num_depths - 1  # depths 2..K, at slots n + 1 .. n + K - 1
        index = torch.arange(1, rows + 1, device=device)  # [R]
        columns = torch.arange(rows + 1, device=device)  # [R + 1] scratch slots 0 (the root's, unwritten) .. R
        with torch.no_grad():
            mask_hidden = self.draft.mask_hidden_input().reshape(1, -1)  # [1, H]
        self.mask_hidden = mask_hidden.to(dtype).expand(rows, -1).contiguous()  # [R, H]
        self.mask_tokens = torch.full((rows,), self.mask_token_id, dtype=torch.long, device=device)  # [R]
        self.mask_slots = index  # [R] scratch slots, and each row's depth offset
        self.mask_visible = (columns[None, :] >= 1) & (columns[None, :] <= index[:, None])  # [R, R + 1]

    @torch.no_grad()
    def mask_logits(self, prefix_len: torch.Tensor) -> torch.Tensor:
        """Depths 2..K's logits [K - 1, Vd] in one forward of the mask rows (after the cycle's ingest)."""
        q = self.query(self.mask_hidden, self.mask_tokens, prefix_len + self.mask_slots, self.mask_slots,
                       position_offset=-1, slot_base=prefix_len)  # rotary n - 1 + d, KV at slot n + d
        attended = draft_attention(q, self.k_cache, self.v_cache, prefix_len, self.mask_visible, root_written=False)
        normed, _ = self.tail(self.mask_hidden, attended)
        return self.draft.lm_head(normed)  # [R, Vd]

    @torch.no_grad()
    def propose(self, root_token: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
        """root_token [1], prefix_len [1] (the root's position n) -> draft_logits [K, Vd], row j - 1 the token at
        n + j. The root's own embedding entered at the ingest (column n - 1 read x_n)."""
        first = self.draft.lm_head(fused_norm(self.draft.norm, self.last_hidden))  # [1, Vd] depth 1
        if self.num_depths == 1:
            return first
        return torch.cat([first, self.mask_logits(prefix_len)])  # [K, Vd]


def peagle_runtime(draft: PEagleDraft, cfg: PEagleConfig, target_model) -> PEagleDrafter:
    return PEagleDrafter(draft, target_model)
