"""A batch's rollout rows for P-EAGLE's training forward, and conditional drop-token sampling.

A row of T columns is drafted from at every column at once: group 0 is the columns themselves (fused target
features at t, token t + 1: EAGLE-3's step 0, which drafts depth 1), group g >= 1 is depth g + 1 drafted from a
column through g mask rows. Each group is laid out after the one before, so one call of the decoder layer runs them
all (specdraft.kernels.rollout_attention says which row sees which). Group g keeps only n_g of the columns
group g - 1 kept (config.cod_sizes): conditional drop-token sampling, a random draw that takes columns whose
depth carries a loss first. Shapes depend on T alone, and nothing is read back to the host: a CUDA graph may
capture the step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch


@dataclass
class Rollout:
    """Where every rollout row of a batch stands."""

    anchors: torch.Tensor  # [B, L] the column each row drafts from
    groups: torch.Tensor  # [B, L] its group: 0 (the column itself) .. K - 1
    sizes: List[int]  # rows of each group, [T, n_1, .., n_{K-1}]: L is their sum
    parents: List[torch.Tensor]  # parents[g - 1] [B, n_g]: each anchor's index among group g - 1's

    def rows(self, group: int) -> slice:
        """The flat rows of `group`."""
        start = sum(self.sizes[:group])
        return slice(start, start + self.sizes[group])

    def group_anchors(self, group: int) -> torch.Tensor:  # [B, n_g], ascending
        return self.anchors[:, self.rows(group)]


def sample_rollout(priority: List[torch.Tensor], sizes: List[int]) -> Rollout:
    """priority[g] [B, T] bool (the columns whose group-g draft carries a loss); sizes from cod_sizes -> the
    batch's rollout. Group g draws n_g of group g - 1's columns, those with priority first, uniformly within each
    kind (each batch row on its own)."""
    batch, columns = priority[0].shape
    device = priority[0].device
    kept = torch.arange(columns, device=device).expand(batch, columns)  # [B, T] group 0: every column
    anchors, parents = [kept], []
    for group in range(1, len(sizes)):
        first = priority[group].gather(1, kept).float()  # [B, n_{g-1}]
        scores = 2.0 * first + torch.rand(first.shape, device=device)  # priority columns outrank every other
        pick = scores.topk(sizes[group], dim=1).indices.sort(dim=1).values  # [B, n_g] in column order
        kept = kept.gather(1, pick)
        anchors.append(kept)
        parents.append(pick)
    groups = torch.cat([torch.full((batch, size), group, dtype=torch.long, device=device)
                        for group, size in enumerate(sizes)], dim=1)  # [B, L]
    return Rollout(anchors=torch.cat(anchors, dim=1), groups=groups, sizes=list(sizes), parents=parents)


def rollout_inputs(rollout: Rollout, fused: torch.Tensor, next_embeds: torch.Tensor, mask_hidden: torch.Tensor,
                   mask_embed: torch.Tensor, position_ids: torch.Tensor):
    """The rows' inputs: group 0 reads fused [B, T, H] and next_embeds [B, T, H] (column t: embedding of token
    t + 1), the mask rows mask_hidden [1, 1, H] and mask_embed [H]; position_ids [B, T] -> (hidden, embeds
    [B, L, H], rotary positions [B, L]: the column's position plus the group)."""
    batch, masked = fused.shape[0], sum(rollout.sizes[1:])
    hidden = torch.cat([fused, mask_hidden.to(fused.dtype).expand(batch, masked, -1)], dim=1)
    embeds = torch.cat([next_embeds, mask_embed.to(next_embeds.dtype).expand(batch, masked, -1)], dim=1)
    positions = position_ids.gather(1, rollout.anchors) + rollout.groups  # [B, L]
    return hidden, embeds, positions
