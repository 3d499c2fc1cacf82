"""Rollout attention on flex attention (torch.nn.attention.flex_attention): the visibility rule of reference.py
as a mask_mod over each batch row's anchors and groups, one BlockMask a batch (the rows are sampled anew for each
one). Rows lie group after group and, within a group, in column order, so the mask is block-sparse: a group's rows
against group 0 are causal, against any other group a band around the diagonal. On CUDA the flex call is compiled
(torch.compile), which is what makes it fast."""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def rollout_block_mask(anchors: torch.Tensor, groups: torch.Tensor, document_ids: Optional[torch.Tensor] = None):
    """anchors, groups [B, L] int64; document_ids [B, T] or None -> BlockMask [B, 1, L, L]."""
    batch, rows = anchors.shape
    documents = None if document_ids is None else document_ids.gather(1, anchors)  # [B, L]

    def visible(b, h, q_idx, kv_idx):
        a_q, a_k, g_q, g_k = anchors[b, q_idx], anchors[b, kv_idx], groups[b, q_idx], groups[b, kv_idx]
        seen = ((g_k == 0) & (a_k <= a_q)) | ((a_k == a_q) & (g_k <= g_q))
        return seen if documents is None else seen & (documents[b, q_idx] == documents[b, kv_idx])

    return create_block_mask(visible, batch, None, rows, rows, device=anchors.device)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention)


def flex_rollout_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask) -> torch.Tensor:
    """query [B, h, L, D]; key, value [B, kvh, L, D] -> [B, h, L, D]."""
    run = _compiled_flex() if query.is_cuda else flex_attention
    return run(query, key, value, block_mask=block_mask, enable_gqa=query.shape[1] != key.shape[1])
