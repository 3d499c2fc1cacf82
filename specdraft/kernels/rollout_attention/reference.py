"""Rollout attention, the spec (dense): attention over a flattened set of parallel-drafting rows.

Row i of a batch row stands at column `anchors[i]` (a position of the sequence) in group `groups[i]`: group 0 is
the column itself (the draft's input there: the target's features and the next token), group g > 0 the g-th
position drafted from that column in the same forward, whose inputs are placeholders. Row q sees row k when both
lie in one document and either k is a group-0 row at a column <= q's (the confirmed prefix) or k stands at q's
column in a group <= q's (the positions drafted before q from the same column, and that column itself).
"""
from __future__ import annotations

import math
from typing import Optional

import torch


def rollout_visible(anchors: torch.Tensor, groups: torch.Tensor,
                    document_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """anchors, groups [B, L] int64; document_ids [B, T] (the columns' documents) or None -> [B, 1, L, L] bool."""
    a_q, a_k = anchors[:, :, None], anchors[:, None, :]
    g_q, g_k = groups[:, :, None], groups[:, None, :]
    visible = ((g_k == 0) & (a_k <= a_q)) | ((a_k == a_q) & (g_k <= g_q))  # [B, L, L]
    if document_ids is not None:
        documents = document_ids.gather(1, anchors)  # [B, L]
        visible = visible & (documents[:, :, None] == documents[:, None, :])
    return visible[:, None]


def rollout_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                visible: torch.Tensor) -> torch.Tensor:
    """query [B, h, L, D]; key, value [B, kvh, L, D]; visible [B, 1, L, L] -> [B, h, L, D] (softmax in float32)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)  # [B, h, L, D]
    scores = torch.matmul(query, key.transpose(-1, -2)).mul(1.0 / math.sqrt(query.shape[-1]))  # [B, h, L, L]
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")).float(), dim=-1).to(query.dtype)
    return torch.matmul(probs, value)
