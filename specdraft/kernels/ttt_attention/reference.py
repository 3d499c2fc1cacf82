"""Training-time-test attention, the spec (dense): every query sees the step-0 keys of its own document at
columns <= its own column, and the keys that later steps wrote at its own column (the diagonal).

Also the CPU path and the inference path (queries at arbitrary columns, e.g. one newest column).
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

KV = Tuple[torch.Tensor, torch.Tensor]  # keys, values: [B, kv_heads, T, D]


def step0_visible(query_cols: torch.Tensor, num_cols: int, document_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """query_cols [Tq]; document_ids [B, T0] or None -> [Tq, T0] or [B, 1, Tq, T0] bool: causal, same document."""
    visible = torch.arange(num_cols, device=query_cols.device)[None, :] <= query_cols[:, None]  # [Tq, T0]
    if document_ids is None:
        return visible
    same_document = document_ids[:, query_cols, None] == document_ids[:, None, :]  # [B, Tq, T0]
    return (visible & same_document)[:, None]


def ttt_attention_reference(query: torch.Tensor, steps_kv: List[KV], query_cols: torch.Tensor,
                            document_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """query [B, h, Tq, D]; steps_kv[0] = step 0's keys and values over columns 0..T0-1, steps_kv[j > 0] =
    step j's [B, kvh, Tq, D] aligned with the queries; query_cols [Tq]; document_ids [B, T0] -> [B, h, Tq, D]."""
    groups = query.shape[1] // steps_kv[0][0].shape[1]
    scale = 1.0 / math.sqrt(query.shape[-1])
    k0, v0 = (t.repeat_interleave(groups, dim=1) for t in steps_kv[0])  # [B, h, T0, D]
    visible = step0_visible(query_cols, k0.shape[2], document_ids)
    scores = [torch.matmul(query, k0.transpose(-1, -2)).mul(scale).masked_fill(~visible, float("-inf"))]
    diag_values = []
    for k_j, v_j in steps_kv[1:]:
        scores.append((query * k_j.repeat_interleave(groups, dim=1)).sum(-1, keepdim=True) * scale)  # [B, h, Tq, 1]
        diag_values.append(v_j.repeat_interleave(groups, dim=1))
    probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(query.dtype)  # [B, h, Tq, T0 + J]
    out = torch.matmul(probs[..., : k0.shape[2]], v0)  # [B, h, Tq, D]
    for j, v_j in enumerate(diag_values):
        out = out + probs[..., k0.shape[2] + j, None] * v_j
    return out
