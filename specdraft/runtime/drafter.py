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

from typing import Dict, List, Optional, Protocol, Tuple

import torch

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
        """features {i: [M, H]}, next_tokens [M], start [1], count [1] (both int64)."""

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


class DraftMask:
    """`draft_visible` for a drafter's steps in three launches a step instead of about ten: the confirmed-prefix
    part and the scratch slots' cache columns are built once a cycle (`new_cycle`, from the drafter's `first`), a
    step scatters its scratch_visible [k, W] into that. Needs prefix_len + W <= num_slots (the engine's
    `_check_room` keeps a scratch region free past the prefix)."""

    def __init__(self, num_slots: int, scratch: int, device: torch.device, root_written: bool):
        self.slot_ids = torch.arange(num_slots, device=device)  # [S]
        self.offsets = torch.arange(scratch, device=device)  # [W]
        self.keep = (self.offsets > 0) | root_written  # [W] scratch slot 0 (the root) only when written
        self.prefix = torch.zeros(num_slots, dtype=torch.bool, device=device)  # [S] slots < prefix_len
        self.columns = torch.zeros(scratch, dtype=torch.long, device=device)  # [W] cache slot of scratch slot j

    def state_tensors(self) -> List[torch.Tensor]:
        return [self.prefix, self.columns]

    def new_cycle(self, prefix_len: torch.Tensor) -> None:  # prefix_len [1]
        torch.lt(self.slot_ids, prefix_len, out=self.prefix)
        torch.add(self.offsets, prefix_len, out=self.columns)

    def __call__(self, scratch_visible: torch.Tensor) -> torch.Tensor:  # [k, W] -> [k, S] bool
        k, width = scratch_visible.shape
        allowed = scratch_visible & self.keep[:width]  # [k, W]
        return self.prefix.expand(k, -1).scatter(1, self.columns[:width].expand(k, -1), allowed)


def rope_tables(max_len: int, head_dim: int, theta: float, device, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, D] of positions 0..max_len-1, the rows `layers.rope_cos_sin` gives each position, for
    `kernels.rope_cache` to gather inside its launch."""
    return rope_cos_sin(torch.arange(max_len, device=device), head_dim, theta, dtype)
