"""`rollout_attention`: attention over parallel-drafting rows (P-EAGLE's training forward; reference.py says which
row sees which).

`rollout_mask` builds, once per batch, what the attention needs: on the dense path the [B, 1, L, L] visibility,
for flex attention the BlockMask. `impl="auto"` builds the block mask on CUDA unless SPECDRAFT_KERNELS=reference;
"flex" builds it anywhere (CPU tests run flex eagerly, forward only); "dense" never.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from specdraft.core.errors import choices_error
from specdraft.kernels import use_reference
from specdraft.kernels.rollout_attention.reference import rollout_attention_reference, rollout_visible

IMPLS = ("auto", "dense", "flex")


@dataclass
class RolloutMask:
    """Which rows each row sees, in the form its attention path reads."""

    visible: Optional[torch.Tensor] = None
    """[B, 1, L, L] bool for the dense path; None with a block mask."""
    block_mask: Any = None
    """flex attention's BlockMask, or None for the dense path."""


def rollout_mask(anchors: torch.Tensor, groups: torch.Tensor, document_ids: Optional[torch.Tensor] = None,
                 impl: str = "auto") -> RolloutMask:
    """anchors, groups [B, L] int64; document_ids [B, T] or None (one document a row)."""
    if impl not in IMPLS:
        raise choices_error("rollout attention", impl, IMPLS)
    flex = impl == "flex" or (impl == "auto" and anchors.is_cuda and not use_reference("rollout_attention"))
    if not flex:
        return RolloutMask(visible=rollout_visible(anchors, groups, document_ids))
    from specdraft.kernels.rollout_attention.flex import rollout_block_mask

    return RolloutMask(block_mask=rollout_block_mask(anchors, groups, document_ids))


def rollout_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: RolloutMask) -> torch.Tensor:
    """query [B, h, L, D]; key, value [B, kvh, L, D] -> [B, h, L, D]."""
    if mask.block_mask is not None:
        from specdraft.kernels.rollout_attention.flex import flex_rollout_attention

        return flex_rollout_attention(query, key, value, mask.block_mask)
    return rollout_attention_reference(query, key, value, mask.visible)


__all__ = ["IMPLS", "RolloutMask", "rollout_attention", "rollout_attention_reference", "rollout_mask",
           "rollout_visible"]
