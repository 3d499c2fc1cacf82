"""`ttt_attention`: attention of a training-time-test step (see specdraft/methods/eagle3.py for the layout).

`ttt_mask` builds, once per unroll, what every step's attention needs: the document ids of the columns (packed
rows hold several conversations), the window (`TTTWindow`: LongSpec's sliding window and attention sinks; one
that hides no key of the row, size 0 or at least T, is full attention and dropped here) and, for flex attention,
the block mask (unpacked rows: one per shape and window, kept for every later unroll of that shape).
Dispatch: flex (flex.py) when the mask carries a block mask and the queries are the unroll's columns; the dense
reference otherwise. `impl="auto"` builds the block mask on CUDA unless SPECDRAFT_KERNELS=reference; "flex"
builds it anywhere (CPU tests run flex eagerly); "dense" never.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from specdraft.core.errors import choices_error
from specdraft.kernels import use_reference
from specdraft.kernels.ttt_attention.reference import KV, TTTWindow, ttt_attention_reference

IMPLS = ("auto", "dense", "flex")


@dataclass
class TTTMask:
    """Which step-0 keys each column sees in an unroll over T columns."""

    document_ids: Optional[torch.Tensor] = None
    """[B, T] document of each column (non-decreasing per row); None: one document per row."""
    block_mask: Any = None
    """flex attention's BlockMask for (causal, same document, within the window), or None for the dense path."""
    window: Optional[TTTWindow] = None
    """The sliding window and sinks of the step-0 keys; None: full attention."""


def ttt_mask(document_ids: Optional[torch.Tensor], batch: int, num_cols: int, device: torch.device,
             impl: str = "auto", window: Optional[TTTWindow] = None) -> TTTMask:
    if impl not in IMPLS:
        raise choices_error("TTT attention", impl, IMPLS)
    window = window if window is not None and window.limits(num_cols) else None
    flex = impl == "flex" or (impl == "auto" and torch.device(device).type == "cuda" and not use_reference("ttt_attention"))
    if not flex:
        return TTTMask(document_ids=document_ids, window=window)
    from specdraft.kernels.ttt_attention.flex import ttt_block_mask, unpacked_block_mask

    if document_ids is None:  # the mask depends on the shape alone: built once per shape
        return TTTMask(block_mask=unpacked_block_mask(batch, num_cols, device, window), window=window)
    return TTTMask(document_ids=document_ids, block_mask=ttt_block_mask(document_ids, window), window=window)


def ttt_attention(query: torch.Tensor, steps_kv: List[KV], query_cols: torch.Tensor,
                  mask: Optional[TTTMask] = None) -> torch.Tensor:
    """query [B, h, Tq, D]; steps_kv[0] over columns 0..T0-1, steps_kv[j > 0] aligned with the queries;
    query_cols [Tq] -> [B, h, Tq, D]."""
    mask = mask or TTTMask()
    if mask.block_mask is not None and query.shape[2] == steps_kv[0][0].shape[2]:
        from specdraft.kernels.ttt_attention.flex import flex_ttt_attention

        return flex_ttt_attention(query, steps_kv, mask.block_mask)
    return ttt_attention_reference(query, steps_kv, query_cols, mask.document_ids, mask.window)


__all__ = ["IMPLS", "TTTMask", "TTTWindow", "ttt_attention", "ttt_attention_reference", "ttt_mask"]
