"""DFlash's training blocks: the anchors sampled per sequence, the block attention mask, and the attention over it.

A row of T tokens trains A blocks of Bk positions each (A = num_anchors, Bk = block_size), the queries laid out
block after block (query q belongs to block q // Bk, its position anchor + q % Bk). The keys are the row's T context
columns (the target's fused features), then the A * Bk block positions. Block j sees:
  - the context columns before its anchor a_j, in a_j's document (packed rows hold several conversations);
  - every position of its own block, both ways (bidirectional inside the block);
and nothing of another block: exactly what the drafter sees at inference with the root at a_j and the confirmed
prefix 0..a_j-1. The mask is one [Q, T + Q] pattern per row: dense (a bool tensor, SDPA) on the CPU, a flex
attention BlockMask on CUDA (the dense one is A * Bk * (T + A * Bk) bools a row, and its attention scores with it).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from specdraft.kernels import use_reference


@dataclass
class Anchors:
    """Each row's sampled anchors, ascending (fillers first, at column 0)."""

    positions: torch.Tensor  # [B, A] int64 column of each block's anchor
    valid: torch.Tensor  # [B, A] bool: a sampled anchor (False: a filler block, no loss)


def anchor_candidates(loss_mask: torch.Tensor, attention_mask: torch.Tensor,
                      document_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """[B, T] bool: columns a block may start at: an answer token (at inference the root is one) whose next
    column is an answer token of the same document (the block's first drafted position carries a loss)."""
    valid = (loss_mask * attention_mask) > 0  # [B, T]
    following = torch.zeros_like(valid)
    following[:, :-1] = valid[:, 1:]
    if document_ids is not None:
        following[:, :-1] &= document_ids[:, 1:] == document_ids[:, :-1]
    return valid & following


def sample_anchors(candidates: torch.Tensor, num_anchors: int, generator: Optional[torch.Generator] = None) -> Anchors:
    """candidates [B, T] bool -> `num_anchors` distinct anchors a row, uniformly among its candidates (a random
    score each, the top num_anchors kept: static shapes, no host read), ascending; a row with fewer candidates
    fills the rest with invalid anchors at column 0."""
    batch, cols = candidates.shape
    scores = torch.rand(batch, cols, device=candidates.device, generator=generator)
    scores = torch.where(candidates, scores, -1.0)  # [B, T]
    if num_anchors > cols:
        scores = torch.cat([scores, scores.new_full((batch, num_anchors - cols), -1.0)], dim=1)
    best, columns = scores.topk(num_anchors, dim=1)  # [B, A]
    valid = best >= 0
    positions = torch.where(valid, columns, 0)
    order = positions.argsort(dim=1, stable=True)
    return Anchors(positions=positions.gather(1, order), valid=valid.gather(1, order))


def block_columns(anchors: Anchors, block: int, cols: int) -> torch.Tensor:
    """[B, A * Bk] the column of each block position (anchor + k), clamped into the row (a position past the row's
    end carries no loss; its clamped column only names something to read)."""
    offsets = torch.arange(block, device=anchors.positions.device)
    return (anchors.positions[:, :, None] + offsets).flatten(1).clamp(max=cols - 1)


def dense_block_mask(anchors: Anchors, block: int, cols: int,
                     document_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """-> [B, Q, T + Q] bool (Q = A * Bk): query i sees key j (module docstring)."""
    query_anchor = anchors.positions.repeat_interleave(block, dim=1)  # [B, Q]
    context = torch.arange(cols, device=query_anchor.device)  # [T]
    sees_context = context[None, None, :] < query_anchor[:, :, None]  # [B, Q, T]
    if document_ids is not None:
        anchor_document = document_ids.gather(1, query_anchor)  # [B, Q]
        sees_context &= document_ids[:, None, :] == anchor_document[:, :, None]
    block_of = torch.arange(query_anchor.shape[1], device=query_anchor.device) // block  # [Q]
    same_block = (block_of[:, None] == block_of[None, :]).expand(query_anchor.shape[0], -1, -1)  # [B, Q, Q]
    return torch.cat([sees_context, same_block], dim=2)


def flex_block_mask(anchors: Anchors, block: int, cols: int, document_ids: Optional[torch.Tensor] = None):
    """The same pattern as flex attention's BlockMask (built from its mask_mod, block-sparse)."""
    from torch.nn.attention.flex_attention import create_block_mask

    query_anchor = anchors.positions.repeat_interleave(block, dim=1)  # [B, Q]
    batch, queries = query_anchor.shape
    documents = document_ids if document_ids is not None else torch.zeros(
        batch, cols, dtype=torch.long, device=query_anchor.device)

    def sees(b, h, q_idx, kv_idx):
        anchor = query_anchor[b, q_idx]
        context = kv_idx < cols
        column = torch.clamp(kv_idx, max=cols - 1)
        in_context = context & (column < anchor) & (documents[b, column] == documents[b, anchor])
        in_block = (~context) & ((kv_idx - cols) // block == q_idx // block)
        return in_context | in_block

    return create_block_mask(sees, batch, None, queries, cols + queries, device=query_anchor.device)


@dataclass
class BlockMask:
    """What the block attention reads: the dense mask or flex attention's BlockMask (one of them)."""

    dense: Optional[torch.Tensor] = None  # [B, Q, T + Q] bool
    flex: Any = None


def block_mask(anchors: Anchors, block: int, cols: int, document_ids: Optional[torch.Tensor],
               impl: str = "auto") -> BlockMask:
    """The mask of this batch's blocks: flex on CUDA under "auto" (unless SPECDRAFT_KERNELS=reference) and under
    "flex" anywhere (the CPU runs it eagerly), dense otherwise."""
    device = anchors.positions.device
    flex = impl == "flex" or (impl == "auto" and device.type == "cuda" and not use_reference("ttt_attention"))
    if flex:
        return BlockMask(flex=flex_block_mask(anchors, block, cols, document_ids))
    return BlockMask(dense=dense_block_mask(anchors, block, cols, document_ids))


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def block_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: BlockMask) -> torch.Tensor:
    """query [B, h, Q, D]; key, value [B, kvh, T + Q, D] -> [B, h, Q, D] (softmax over what `mask` lets each query
    see; every query sees at least its own block)."""
    gqa = query.shape[1] != key.shape[1]
    if mask.flex is not None:
        from torch.nn.attention.flex_attention import flex_attention

        run = _compiled_flex() if query.is_cuda else flex_attention
        return run(query, key, value, block_mask=mask.flex, enable_gqa=gqa)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask.dense[:, None], enable_gqa=gqa)
