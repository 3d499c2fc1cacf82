"""What the runtime needs from a method at inference: a `Drafter`, built by the method spec's `runtime` hook
(`spec.runtime(draft, cfg, target_model) -> Drafter`).

The engine owns the target, its static KV cache and the draft tree; a drafter owns its draft's own caches.
Positions are sequence positions: the confirmed tokens are x_0..x_n, where the root x_n is the newest one (the
target has not run on it yet); a node at depth d of the tree (its token is the d-th drafted token) has
position n + d. One draft-verify cycle (batch 1) calls, in order:

  ingest(features, next_tokens, start, count)
      Positions start..start+count-1 were just run through the target: features[i] [M, H] are the target's
      hidden states there (input of decoder layer i, for i in `feature_layers`) and next_tokens [M] the token
      that follows each position (the last valid one is the new root x_n). Rows >= count are padding (static
      shapes for CUDA graphs). After it, the drafter's confirmed prefix is slots 0..n-1 of its caches.
  first(root_token, position) -> (logits [1, Vd], hidden [1, Hd])
      The draft's distribution for depth 1. A drafter that runs on the root token writes its KV at scratch
      slot 0 (cache slot n); one that has it from `ingest` (EAGLE-3) writes nothing there.
  step(depth, hidden, tokens, positions, scratch_slots, scratch_visible) -> (logits [k, Vd], hidden [k, Hd])
      k frontier nodes at `depth` (a Python int, 1-based): `hidden` [k, Hd] is each node's parent's output,
      `tokens` [k] and `positions` [k] the nodes' own, `scratch_slots` [k] int64 where their KV goes in the
      scratch region (cache slot n + scratch_slots), `scratch_visible` [k, W] bool the scratch slots each may
      attend to (its ancestors, scratch slot 0 = the root, and itself); the whole confirmed prefix 0..n-1 is
      visible too. A drafter that wrote nothing at scratch slot 0 must ignore that column.

Every tensor argument is on the engine's device and every shape is static for a given (k, depth, W), so the
engine can capture `ingest`, `first` and `step` in CUDA graphs: no host syncs, no data-dependent shapes.
Draft vocabulary index i is target token i + d2t[i]. With k = 1 (a chain) `scratch_slots` is [depth] and every
scratch slot 0..depth is visible: all earlier nodes are ancestors.

Optional, for drafters that run the target's own shallow layers (self-speculation, e.g. Kangaroo):
  verify_start_layer: int
      Chain verification may start at this target layer: the drafter ran the chain's nodes through layers
      0..verify_start_layer-1 while drafting (their KV is in the target cache at the nodes' slots).
  chain_verify_states(tokens, positions, computed) -> hidden [n, H]
      The chain's n nodes (root, then the drafts; tokens [n], positions [n]) entering layer verify_start_layer.
      The first `computed` (a Python int) went through the shallow layers in `first`/`step` (scratch slots
      0..computed-1); the drafter runs the rest (the last drafted token, which no step read) through them now,
      writing their shallow KV at target slots prefix + computed...
  keep_tree_states(num_candidates)
      Tree verification may start at verify_start_layer too (the engine's `reuse_shallow_tree`): called once
      after `allocate`. From then on `build_tree` calls `tree_candidates` after `first` and after each `step`,
      and a tree's `step` takes its frontier's shallow states from the latest `tree_candidates` call.
  tree_candidates(tokens, positions, first, paths, frontier)
      A depth's c new tree candidates (tokens [c], positions [c]; candidate indices first..first+c-1, `first` a
      Python int, the root being candidate 0) through the drafter's shallow layers, each attending to the
      confirmed prefix and the candidates paths [c, C] marks (those from the root to itself); their shallow KV
      goes to target slots prefix + candidate index. frontier [k] int64: which of the c the next `step` expands.
  tree_verify_states(candidate_ids) -> hidden [N, H]
      The verified tree's nodes (candidate_ids [N], ascending, the root first) entering verify_start_layer; moves
      their shallow KV from target slots prefix + candidate index to prefix + node index, the slots the verify's
      tree attention reads and the engine's compaction moves.
  exit_threshold: float
      The confidence exit η the method was trained for (the engine's default when none is given).
  draft_cost_layers: float
      What one draft step costs, in target-layer equivalents (dynamic_exit.py's cost model).
  exit_costs: List[float], select_exit(index), variant: int
      A drafter holding several drafts (dynamic_exit.ExitChoice): each one's draft-step cost, the switch
      between cycles, and the one drafting now (the engine captures its CUDA graphs per variant).
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional, Protocol, Tuple

import torch

from specdraft.kernels.tree_attention import tree_attention
from specdraft.layers import rope_cos_sin


class Drafter(Protocol):
    feature_layers: List[int]
    """Target hidden-state indices (input of decoder layer i; 0 = embeddings) that `ingest` reads."""
    d2t: torch.Tensor
    """[Vd] int64 offsets: target id of draft index i is i + d2t[i]."""

    def allocate(self, max_len: int, scratch: int, device: torch.device, dtype: torch.dtype) -> None:
        """Static caches for `max_len` confirmed slots plus `scratch` drafting slots; resets the prefix."""

    def ingest(self, features: Dict[int, torch.Tensor], next_tokens: torch.Tensor, start: torch.Tensor,
               count: torch.Tensor) -> None:
        """features {i: [M, H]}, next_tokens [M], start [1], count [1] (both int64; read during the call only: the
        engine advances `start`, its prefix length, right after)."""

    def first(self, root_token: torch.Tensor, position: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """root_token [1], position [1] -> (logits [1, Vd], hidden [1, Hd])."""

    def step(self, depth: int, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             scratch_slots: torch.Tensor, scratch_visible: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """hidden [k, Hd], tokens [k], positions [k], scratch_slots [k], scratch_visible [k, W]."""


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
    """start [1] -> [rows] the slots start..start+rows-1 an ingest writes (one launch: the range is cached)."""
    return start + _row_index(rows, device)


@functools.lru_cache(maxsize=16)
def _row_index(rows: int, device: torch.device) -> torch.Tensor:
    return torch.arange(rows, device=device)  # [rows]


@functools.lru_cache(maxsize=16)
def _causal(rows: int, device: torch.device) -> torch.Tensor:
    return torch.ones(rows, rows, dtype=torch.bool, device=device).tril()  # [M, M] row i sees rows 0..i


def rope_tables(max_len: int, head_dim: int, theta: float, device, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, D] of positions 0..max_len-1, the rows `layers.rope_cos_sin` gives each position, for
    `kernels.rope_cache` to gather inside its launch."""
    return rope_cos_sin(torch.arange(max_len, device=device), head_dim, theta, dtype)
