"""A pruned tree verified at the size of what its scorer keeps (`SpecEngine` with a tree scorer and `prune_verify`
"kept", the default).

The fixed tree's cycle is one CUDA graph of static shapes, so the candidates a scorer drops still cost their verify
rows, as padding. Here the cycle is two graphs: the drafting, whose tree has its real nodes moved ahead of the
padding (`tree.kept_first`) and whose output includes their count; and the verify (acceptance and commit included)
of the first `rows` nodes, one graph per size of `tree.verify_sizes` (the multiples of 8 up to the budget). Between
them the host reads the count (the cycle's one wait for the device, which idles from the drafting's end until the
verify is queued) and replays the smallest size that holds it; at T=0 every size is captured at the first cycle.
The rows past the real nodes are padding that hangs under no node (parent -1), so no acceptance rule takes them,
and their KV slots lie past the accepted path, which alone is compacted. The tokens of the cycle before are still
read while this one's verify runs (engine.py's step in flight).
"""
from __future__ import annotations

from functools import partial
from typing import Dict, Optional, Set, Tuple

import torch

from specdraft.config import PRUNE_AT, PRUNE_VERIFY
from specdraft.core.errors import choices_error
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.host_reader import HostReader
from specdraft.decoding.tree import DraftTree, kept_first, tree_rows, verify_size, verify_sizes


class SizedVerify:
    """The two-graph cycle of a SpecEngine's pruned tree (module docstring)."""

    def __init__(self, engine):
        self.engine = engine
        self.sizes = verify_sizes(engine.shape.budget)
        self.reader = HostReader(1, engine.device)
        self.drafted: Dict[str, DraftTree] = {}  # each drafting graph's tree (its outputs), which its verifies read
        self.captured: Set[str] = set()  # the drafting graphs whose every verify size is captured

    def _draft(self, policy: Acceptance, key: str, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The drafting graph: the tree, real nodes first, kept under `key` -> their count [1]."""
        engine = self.engine
        tree = self.drafted[key] = kept_first(engine.build_tree(engine.draws(policy, noise)))
        return tree.valid.sum(0, keepdim=True)

    def _verify(self, policy: Acceptance, key: str, rows: int, randomness: Optional[torch.Tensor] = None):
        """The verify graph of `rows` rows: the first `rows` nodes of the tree drafted under `key`, verified,
        accepted and committed -> the engine's CycleOutput."""
        engine = self.engine
        tree = tree_rows(self.drafted[key], rows)
        return engine.accept_and_commit(policy, tree, engine.verify_forward(tree), randomness)

    def cycle(self, policy: Acceptance, generator) -> Tuple[object, int, int]:
        """One cycle -> (its CycleOutput, the drafted tokens it verified, the rows its verify ran)."""
        engine = self.engine
        noise = engine.draft_noise(policy, engine.shape.expanded_rows, generator)
        key = engine.scored_key(f"draft:{policy.key}")
        kept = engine.graphed(key, partial(self._draft, policy, key), *(() if noise is None else (noise,)))
        staged = self.reader.stage(kept)
        self._capture_sizes(policy, key)
        kept = self.reader.read(staged, 1)[0]  # the host waits for the drafting here
        rows = verify_size(kept, self.sizes)
        randomness = policy.randomness(rows, generator, engine.device)
        out = engine.graphed(f"{key}:verify@{rows}", partial(self._verify, policy, key, rows),
                             *(() if randomness is None else (randomness,)))
        return out, kept - 1, rows

    def _capture_sizes(self, policy: Acceptance, key: str) -> None:
        """At a drafting graph's first cycle, with graphs and no random draws (T=0), every size's verify graph
        captured at once: none is captured later, in the middle of a timed generation."""
        engine = self.engine
        if not engine.use_graphs or policy.temperature > 0 or key in self.captured:
            return
        self.captured.add(key)
        for rows in self.sizes:
            verify = partial(self._verify, policy, key, rows)
            engine.graph(f"{key}:verify@{rows}", verify, engine.state_tensors()).ready()


def checked_prune_options(prune_at: str, prune_verify: str) -> Tuple[str, str]:
    """(prune_at, prune_verify), or one line naming the bad one and the valid ones."""
    for name, value, valid in (("prune_at", prune_at, PRUNE_AT), ("prune_verify", prune_verify, PRUNE_VERIFY)):
        if value not in valid:
            raise choices_error(f"runtime.{name}", value, valid)
    return prune_at, prune_verify
