"""A runtime drafter's own KV cache, as every draft head attends over it: the confirmed prefix, then the scratch
slots of the nodes drafted this cycle (specdraft.core.drafting). Shared by the methods' drafters.

A draft with an attention window (method.attention_window, LongSpec) keeps a ring instead (`RingLayout`): the
first `sinks` positions, the `window` newest in a ring of as many slots, then the scratch slots and a slot nothing
reads: the same size at any context length. Its drafting steps attend over every held slot with the prefix's
kernel (the held positions are exactly a query's window); its ingests attend over the ring before their rows and
their own rows, masked by position (`ring_ingest_attention`), then write the rows the ring keeps (`ring_commit`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn.functional as F

from specdraft.kernels.tree_attention import MAX_WINDOW, tree_attention
from specdraft.layers.blocks import rope_cos_sin


def draft_visible(prefix_len: torch.Tensor, num_slots: int, scratch_visible: torch.Tensor,
                  root_written: bool) -> torch.Tensor:
    """The slots of a drafter's own KV cache that k frontier nodes attend to -> [k, S] bool: the confirmed
    prefix (slots < prefix_len [1]) and the scratch slots prefix_len + j that scratch_visible [k, W] allows;
    scratch slot 0 (the root) only when the drafter wrote KV there (`root_written`)."""
    relative = torch.arange(num_slots, device=scratch_visible.device) - prefix_len  # [S]
    width = scratch_visible.shape[1]
    allowed = scratch_visible if root_written else torch.cat([torch.zeros_like(scratch_visible[:, :1]),
                                                              scratch_visible[:, 1:]], dim=1)
    in_scratch = allowed[:, relative.clamp(0, width - 1)] & (relative >= 0) & (relative < width)  # [k, S]
    return in_scratch | (relative < 0)


def draft_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_len: torch.Tensor,
                    scratch_visible: torch.Tensor, root_written: bool) -> torch.Tensor:
    """A drafting step's attention over a drafter's own cache: q [Hq, k, D] of k frontier nodes, k_cache and
    v_cache [Hkv, S, D]; each node sees the confirmed prefix (slots < prefix_len [1]) and the scratch slots
    prefix_len + j that scratch_visible [k, W] marks, scratch slot 0 (the root) only when the drafter wrote KV
    there (`root_written`) -> [Hq, k, D] (token-major from the kernel: the output projection reads it without a
    copy). `kernels.tree_attention` with the scratch slots as its window (from column 1 on when the root's is
    unwritten): two launches, where a [k, S] mask built each step, its conversion and SDPA took about seven (as
    `draft_visible` spells out, its test's spec)."""
    return tree_attention(q, k_cache, v_cache, prefix_len, scratch_visible, q.shape[-1] ** -0.5,
                          first_column=0 if root_written else 1)


def ingest_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     start: torch.Tensor) -> torch.Tensor:
    """An ingest's attention over a drafter's own cache: q [Hq, M, D] of rows whose keys were just written at slots
    start..start+M-1 (start [1]), each seeing every slot up to its own -> [Hq, M, D] (token-major from the kernel).
    A cycle's M (depth + 1) fits the kernel's window; a prompt's longer M takes its reference."""
    return tree_attention(q, k_cache, v_cache, start, _causal(q.shape[1], q.device), q.shape[-1] ** -0.5)


def ingest_slots(start: torch.Tensor, rows: int, device: torch.device) -> torch.Tensor:
    """start [1] -> [rows] the slots start..start+rows-1 an ingest writes (one launch for a cycle's rows: their
    range is kept)."""
    return start + _row_index(rows, device)


# A CUDA graph reads a tensor at the address it had at the capture and holds no reference to it, so a tensor made
# before the capture that a graph reads must live as long as the graph: these constants are never evicted (an
# evicted row index is freed memory to the graphs that read it; once reused, their ingests write the drafter's keys
# at whatever slots it holds, out of the cache). A cycle's few sizes (at most MAX_WINDOW rows) are kept; a prompt's
# rows, one size per prefill length, are made in the call (in a captured prefill, the graph's own memory).
def _row_index(rows: int, device: torch.device) -> torch.Tensor:
    return _kept_row_index(rows, device) if rows <= MAX_WINDOW else torch.arange(rows, device=device)  # [rows]


def _causal(rows: int, device: torch.device) -> torch.Tensor:
    return _kept_causal(rows, device) if rows <= MAX_WINDOW else _causal_mask(rows, device)  # [M, M]


@functools.cache
def _kept_row_index(rows: int, device: torch.device) -> torch.Tensor:
    return torch.arange(rows, device=device)  # [rows]


@functools.cache
def _kept_causal(rows: int, device: torch.device) -> torch.Tensor:
    return _causal_mask(rows, device)


def _causal_mask(rows: int, device: torch.device) -> torch.Tensor:
    return torch.ones(rows, rows, dtype=torch.bool, device=device).tril()  # [M, M] row i sees rows 0..i


def rope_tables(max_len: int, head_dim: int, theta: float, device, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, D] of positions 0..max_len-1, the rows `layers.rope_cos_sin` gives each position, for
    `kernels.rope_cache` to gather inside its launch."""
    return rope_cos_sin(torch.arange(max_len, device=device), head_dim, theta, dtype)


@dataclass(frozen=True)
class RingLayout:
    """The slots of a windowed drafter's KV cache: [sinks | ring of `window` | `scratch` drafting slots | trash].
    Column c (the draft's sequence position) lives at slot c below `sinks`, else at sinks + (c - sinks) % window;
    until the ring fills, slot = column, as in a full cache."""

    sinks: int
    window: int
    scratch: int

    @property
    def held(self) -> int:
        """Slots of confirmed columns: the sinks and the ring."""
        return self.sinks + self.window

    @property
    def trash(self) -> int:
        """The slot rows the ring does not keep are written to (never read)."""
        return self.held + self.scratch

    @property
    def slots(self) -> int:
        return self.trash + 1

    def slot_of(self, columns: torch.Tensor) -> torch.Tensor:
        """columns [M] -> their slots [M]."""
        ring = self.sinks + torch.remainder(columns - self.sinks, self.window)
        return torch.where(columns < self.sinks, columns, ring)

    def held_columns(self, written: torch.Tensor) -> torch.Tensor:
        """written [1] (columns 0..written-1 went in) -> [held] the column each held slot holds, -1 where none."""
        slots = torch.arange(self.held, device=written.device)  # [held]
        ring_index = slots - self.sinks
        newest = written - 1 - self.sinks - ring_index  # laps past the slot's first column, times window
        ring_column = self.sinks + ring_index + torch.div(newest, self.window, rounding_mode="floor") * self.window
        column = torch.where(slots < self.sinks, slots, ring_column)
        written_yet = torch.where(slots < self.sinks, slots < written, newest >= 0)
        return torch.where(written_yet, column, torch.full_like(column, -1))


def ring_visible_len(layout: RingLayout, prefix_len: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The held slots a drafting step sees, min(prefix_len, held), into out [1]: its scratch slots follow them."""
    return torch.clamp(prefix_len, max=layout.held, out=out)


RING_QUERY_ROWS = 1024
"""Rows of a long ingest (a prompt's) attended at once: each sees the ring, the prompt's possible sinks and its own
band of window + rows keys, so the work is linear in the prompt's length."""


def ring_ingest_attention(q: torch.Tensor, new_k: torch.Tensor, new_v: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, layout: RingLayout, start: torch.Tensor) -> torch.Tensor:
    """An ingest's attention for a windowed draft: q [Hq, M, D] and new_k, new_v [Hkv, M, D] of the rows at columns
    start..start+M-1 (start [1]), not yet in the ring; k_cache, v_cache [Hkv, S, D] the ring's (RingLayout). Row i
    sees the held columns and the rows k <= i whose column is within `window` of its own or below `sinks`
    -> [Hq, M, D]."""
    rows, group = q.shape[1], q.shape[0] // k_cache.shape[0]
    held_columns = layout.held_columns(start)  # [held]
    row_columns = start + torch.arange(rows, device=q.device)  # [M]
    outs = []
    for first in range(0, rows, RING_QUERY_ROWS):
        last = min(first + RING_QUERY_ROWS, rows)
        band = max(0, first - layout.window + 1)  # rows before it are out of every window of this chunk
        sink_rows = min(layout.sinks, band)  # rows before the band that may be sinks (column < sinks)
        key_columns = torch.cat([held_columns, row_columns[:sink_rows], row_columns[band:last]])  # [K]
        known = torch.cat([held_columns >= 0, torch.ones(last - band + sink_rows, dtype=torch.bool,
                                                         device=q.device)])  # [K]
        query_columns = row_columns[first:last, None]  # [m, 1]
        visible = known & (key_columns <= query_columns) & \
            ((query_columns - key_columns < layout.window) | (key_columns < layout.sinks))  # [m, K]
        keys = torch.cat([k_cache[:, :layout.held], new_k[:, :sink_rows], new_k[:, band:last]], dim=1)
        values = torch.cat([v_cache[:, :layout.held], new_v[:, :sink_rows], new_v[:, band:last]], dim=1)
        outs.append(F.scaled_dot_product_attention(q[:, first:last], keys.repeat_interleave(group, dim=0),
                                                   values.repeat_interleave(group, dim=0), attn_mask=visible,
                                                   scale=q.shape[-1] ** -0.5))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def ring_commit(layout: RingLayout, k_cache: torch.Tensor, v_cache: torch.Tensor, new_k: torch.Tensor,
                new_v: torch.Tensor, start: torch.Tensor, count: torch.Tensor) -> None:
    """The ingest's rows into the ring: row i (column start + i) is kept when i < count and it is a sink or among
    the `window` newest columns; the others (padding, columns a later row of the same ingest overwrites) go to the
    trash slot. k_cache, v_cache [Hkv, S, D] (one specialist's); new_k, new_v [Hkv, M, D]."""
    columns = start + torch.arange(new_k.shape[1], device=new_k.device)  # [M]
    end = start + count  # [1]
    kept = (columns < end) & ((columns < layout.sinks) | (columns >= end - layout.window))
    slots = torch.where(kept, layout.slot_of(columns), torch.full_like(columns, layout.trash))  # [M]
    k_cache.index_copy_(1, slots, new_k)
    v_cache.index_copy_(1, slots, new_v)


def row_index(rows: int, device: torch.device) -> torch.Tensor:
    """[rows] 0..rows-1 (kept for a cycle's few sizes: a CUDA graph may read it)."""
    return _row_index(rows, device)
