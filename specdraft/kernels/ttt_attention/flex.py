"""Training-time-test attention on flex attention (torch.nn.attention.flex_attention).

The queries of every step are the T columns, so the step-0 part is the same block-sparse problem at every
step: causal within each document (several packed conversations per row), one BlockMask built once per batch;
with a TTTWindow also within the window or at a sink, whose block sparsity makes the work and memory linear in T.
flex_attention returns it with its log-sum-exp; the diagonal keys of steps 1..j (one per query) are scored
elementwise and merged in by their weights, softmax([lse_0, s_1, ..., s_j]). Gradients flow through the
log-sum-exp. On CUDA the flex call and the merge are compiled (torch.compile), which is what makes them fast.
"""
from __future__ import annotations

import functools
import math
from typing import List, Optional

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from specdraft.kernels.ttt_attention.reference import KV, TTTWindow, document_columns


MASK_BLOCK = 128
"""flex attention's block size (its default), the granularity of a BlockMask's sparsity."""
DENSE_MASK_ELEMENTS = 2 ** 28
"""Above this many [B, T, T] mask elements (T = 16384 at B = 1) a BlockMask is built a band of query blocks at a
time (`chunked_block_mask`), its memory linear in T: create_block_mask evaluates the whole [B, T, T] mask at once
(4 GiB of bools at T = 65536)."""
MASK_CHUNK_ROWS = 2048
"""Query rows a band of `chunked_block_mask` evaluates at once ([B, 2048, T] bools: 128 MiB at T = 65536)."""


def _mask_mod(document_ids: Optional[torch.Tensor], window: Optional[TTTWindow]):
    """flex's mask_mod for causal attention within each document (document_ids [B, T], None: one a row), within
    `window` (TTTWindow; None: full) or at one of the document's sinks."""
    doc_cols = document_columns(document_ids) if document_ids is not None and window is not None else None

    def visible(b, h, q_idx, kv_idx):
        seen = kv_idx <= q_idx
        if window is not None:
            sink = kv_idx < window.sinks if doc_cols is None else doc_cols[b, kv_idx] < window.sinks
            seen = seen & ((q_idx - kv_idx < window.size) | sink)
        if document_ids is not None:
            seen = seen & (document_ids[b, q_idx] == document_ids[b, kv_idx])
        return seen

    return visible


def ttt_block_mask(document_ids: torch.Tensor, window: Optional[TTTWindow] = None):
    """document_ids [B, T] (non-decreasing along each row) -> BlockMask: causal and same document (within the
    window, or at a sink, when one is given)."""
    batch, cols = document_ids.shape
    return _block_mask(_mask_mod(document_ids, window), batch, cols, document_ids.device)


def _block_mask(mask_mod, batch: int, cols: int, device: torch.device):
    if batch * cols * cols > DENSE_MASK_ELEMENTS:
        return chunked_block_mask(mask_mod, batch, cols, device)
    return create_block_mask(mask_mod, batch, None, cols, cols, device=device)


def chunked_block_mask(mask_mod, batch: int, cols: int, device: torch.device, chunk_rows: int = MASK_CHUNK_ROWS):
    """The BlockMask create_block_mask builds, from a band of query rows at a time: each band's [B, rows, T]
    mask (mask_mod on broadcast index tensors) reduced to which key blocks it touches and which it fills."""
    blocks = -(-cols // MASK_BLOCK)
    padded = blocks * MASK_BLOCK
    chunk_rows = max(MASK_BLOCK, chunk_rows // MASK_BLOCK * MASK_BLOCK)
    b = torch.arange(batch, device=device)[:, None, None]  # [B, 1, 1]
    kv = torch.arange(padded, device=device)[None, None, :]  # [1, 1, T']
    partial, full = [], []
    for start in range(0, padded, chunk_rows):
        q = torch.arange(start, min(start + chunk_rows, padded), device=device)[None, :, None]  # [1, rows, 1]
        inside = (q < cols) & (kv < cols)
        seen = mask_mod(b, None, q.clamp(max=cols - 1), kv.clamp(max=cols - 1)) & inside
        seen = seen.expand(batch, q.shape[1], padded)  # [B, rows, T'] (a mask_mod may not read b)
        tiles = seen.view(batch, -1, MASK_BLOCK, blocks, MASK_BLOCK)
        touched, filled = tiles.any(4).any(2), tiles.all(4).all(2)  # [B, row blocks, blocks]
        partial.append(touched & ~filled)
        full.append(filled)
    partial_blocks, full_blocks = (torch.cat(part, dim=1)[:, None].to(torch.int8) for part in (partial, full))

    def as_indices(block_flags):  # [B, 1, Qb, KVb] -> (blocks a row, their indices first)
        return block_flags.sum(-1).to(torch.int32), \
            torch.argsort(block_flags, dim=-1, descending=True, stable=True).to(torch.int32)

    return BlockMask.from_kv_blocks(*as_indices(partial_blocks), *as_indices(full_blocks), BLOCK_SIZE=MASK_BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(cols, cols))


def unpacked_block_mask(batch: int, cols: int, device: torch.device, window: Optional[TTTWindow] = None):
    """The BlockMask of `batch` rows of one document each (causal; within `window`, or at a sink, when one is
    given), built once per (batch, cols, device, window) and shared by every later unroll of that shape: building
    it takes dozens of small host-side ops, too many to repeat every step. Kept for the whole
    process (a few KB a shape): a training step's CUDA graph (train.cuda_graphs) reads the mask it was captured
    with at every replay. Under a capture it is built anew and not kept: a mask made during a capture holds its
    values only when the graph replays."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _causal_block_mask(batch, cols, device, window)
    return _cached_causal_block_mask(batch, cols, device, window)


def _causal_block_mask(batch: int, cols: int, device: torch.device, window: Optional[TTTWindow] = None):
    if window is None:
        return ttt_block_mask(torch.zeros(batch, cols, dtype=torch.long, device=device))
    return _block_mask(_mask_mod(None, window), batch, cols, device)


_cached_causal_block_mask = functools.cache(_causal_block_mask)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention)


def _flex_with_lse(query, key, value, block_mask):
    """-> out [B, h, T, D] (query's dtype), lse [B, h, T] float32 (natural log), both differentiable."""
    run = _compiled_flex() if query.is_cuda else flex_attention
    gqa = query.shape[1] != key.shape[1]
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch < 2.9: the older keyword
        return run(query, key, value, block_mask=block_mask, enable_gqa=gqa, return_lse=True)
    out, aux = run(query, key, value, block_mask=block_mask, enable_gqa=gqa, return_aux=AuxRequest(lse=True))
    return out, aux.lse


def merge_diagonal(query: torch.Tensor, out0: torch.Tensor, lse0: torch.Tensor, diag_keys: List[torch.Tensor],
                   diag_values: List[torch.Tensor]) -> torch.Tensor:
    """Step 0's attention merged with the diagonal keys of steps 1..j.

    query [B, h, T, D]; out0 [B, h, T, D] and lse0 [B, h, T] (flex attention over step 0's keys); diag_keys,
    diag_values j tensors [B, kvh, T, D], each one key per query -> [B, h, T, D] in query's dtype."""
    batch, heads, cols, dim = query.shape
    kv_heads = diag_keys[0].shape[1]
    grouped = query.view(batch, kv_heads, heads // kv_heads, cols, dim)  # [B, kvh, g, T, D]
    diag = [(grouped * k_j[:, :, None]).sum(-1).float() / math.sqrt(dim) for k_j in diag_keys]  # [B, kvh, g, T]
    logits = torch.stack([lse0.view_as(diag[0]), *diag], dim=-1)  # [B, kvh, g, T, 1 + J]
    weights = torch.softmax(logits, dim=-1)
    out = weights[..., 0, None] * out0.view_as(grouped)  # [B, kvh, g, T, D] float32
    for j, v_j in enumerate(diag_values, start=1):
        out = out + weights[..., j, None] * v_j[:, :, None]
    return out.to(query.dtype).reshape(batch, heads, cols, dim)


MERGE_RECOMPILE_LIMIT = 64
"""Graphs the compiled merge may keep: Dynamo compiles one per number of diagonal keys (it unrolls the lists) for
the first sequence length, and one per number of keys, over any length, once a second length comes. With 7 TTT
steps that is 12, past Dynamo's default limit of 8, after which the steps that lack a graph would run eagerly."""


@functools.cache
def _compiled_merge():
    return torch.compile(merge_diagonal)


def _run_compiled_merge(*args):
    with torch._dynamo.config.patch(recompile_limit=max(MERGE_RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)):
        return _compiled_merge()(*args)


def flex_ttt_attention(query: torch.Tensor, steps_kv: List[KV], block_mask) -> torch.Tensor:
    """query [B, h, T, D] at columns 0..T-1; steps_kv as in the reference -> [B, h, T, D].

    On CUDA the merge is compiled too: eagerly it runs several elementwise kernels per diagonal key, forward and
    backward, each reading and writing [B, h, T, D] tensors; Inductor fuses each step's into a few."""
    k0, v0 = steps_kv[0]
    out0, lse0 = _flex_with_lse(query, k0, v0, block_mask)
    if len(steps_kv) == 1:
        return out0
    merge = _run_compiled_merge if query.is_cuda else merge_diagonal
    return merge(query, out0, lse0, [k for k, _ in steps_kv[1:]], [v for _, v in steps_kv[1:]])
