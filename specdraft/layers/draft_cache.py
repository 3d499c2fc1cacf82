"""A runtime drafter's own KV cache, as every draft head attends over it: the confirmed prefix, then the scratch
slots of the nodes drafted this cycle (specdraft.core.drafting). Shared by the methods' drafters."""
from __future__ import annotations

import functools
from typing import Tuple

import torch

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
