"""Training-time-test attention, the spec (dense): every query sees the step-0 keys of its own document at
columns <= its own column, and the keys that later steps wrote at its own column (the diagonal). A `TTTWindow`
(LongSpec's sliding window with attention sinks) narrows the step-0 part to the `size` newest columns (the
query's own among them) and the first `sinks` columns of the document; the diagonal is always seen.

Also the CPU path and the inference path (queries at arbitrary columns, e.g. one newest column).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

KV = Tuple[torch.Tensor, torch.Tensor]  # keys, values: [B, kv_heads, T, D]


@dataclass(frozen=True)
class TTTWindow:
    """Which step-0 keys a query at column t sees besides the causal, same-document rule: columns c with
    t - size < c <= t, and the first `sinks` columns of its document. size 0 is full attention (sinks unused)."""

    size: int = 0
    sinks: int = 0

    def limits(self, num_cols: int) -> bool:
        """Whether the window hides any key of a row of `num_cols` columns (else it is full attention)."""
        return 0 < self.size < num_cols


def document_columns(document_ids: torch.Tensor) -> torch.Tensor:
    """document_ids [B, T] (non-decreasing along each row) -> [B, T] each column's index within its document."""
    cols = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.cummax(torch.where(starts, cols, torch.zeros_like(cols)), dim=1).values  # [B, T]
    return cols - first


def step0_visible(query_cols: torch.Tensor, num_cols: int, document_ids: Optional[torch.Tensor],
                  window: Optional[TTTWindow] = None) -> torch.Tensor:
    """query_cols [Tq]; document_ids [B, T0] or None; window (None: full) -> [Tq, T0] (no document ids) or
    [B, 1, Tq, T0] bool: causal, same document, within the window or a sink."""
    cols = torch.arange(num_cols, device=query_cols.device)
    causal = cols[None, :] <= query_cols[:, None]  # [Tq, T0]
    limited = window is not None and window.limits(num_cols)
    visible = causal & (query_cols[:, None] - cols[None, :] < window.size) if limited else causal
    if document_ids is None:
        return visible | (causal & (cols[None, :] < window.sinks)) if limited else visible
    if limited:  # a document's own first columns are its sinks
        visible = visible | (causal & (document_columns(document_ids) < window.sinks)[:, None, :])  # [B, Tq, T0]
    same_document = document_ids[:, query_cols, None] == document_ids[:, None, :]  # [B, Tq, T0]
    return (visible & same_document)[:, None]


def ttt_attention_reference(query: torch.Tensor, steps_kv: List[KV], query_cols: torch.Tensor,
                            document_ids: Optional[torch.Tensor] = None,
                            window: Optional[TTTWindow] = None) -> torch.Tensor:
    """query [B, h, Tq, D]; steps_kv[0] = step 0's keys and values over columns 0..T0-1, steps_kv[j > 0] =
    step j's [B, kvh, Tq, D] aligned with the queries; query_cols [Tq]; document_ids [B, T0]; window (None:
    full attention) -> [B, h, Tq, D]."""
    groups = query.shape[1] // steps_kv[0][0].shape[1]
    scale = 1.0 / math.sqrt(query.shape[-1])
    k0, v0 = (t.repeat_interleave(groups, dim=1) for t in steps_kv[0])  # [B, h, T0, D]
    visible = step0_visible(query_cols, k0.shape[2], document_ids, window)
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
