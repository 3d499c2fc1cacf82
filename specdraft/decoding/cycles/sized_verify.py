"""A pruned tree verified at the size of what its scorer keeps (`SizedVerifyCycle`: a tree scorer with
`prune_verify` "kept", the default).

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
from typing import Dict, Optional, Set

import torch

from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind, CycleRun
from specdraft.decoding.cycles.context import CycleContext
from specdraft.decoding.host_reader import HostReader
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.tree import DraftTree, kept_first, tree_rows, verify_size, verify_sizes


class SizedVerifyCycle(CycleKind):
    """The two-graph cycle of a pruned tree of `shape` (module docstring)."""

    def __init__(self, context: CycleContext, shape: TreeShape):
        self.context, self.shape = context, shape
        self.most_tokens = shape.depth + 1
        self.sizes = verify_sizes(shape.budget)
        self.reader = HostReader(1, context.device)
        self.drafted: Dict[str, DraftTree] = {}  # each drafting graph's tree (its outputs), which its verifies read
        self.captured: Set[str] = set()  # the drafting graphs whose every verify size is captured

    def _draft(self, acceptance: Acceptance, key: str, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The drafting graph: the tree, real nodes first, kept under `key` -> their count [1]."""
        context = self.context
        tree = self.drafted[key] = kept_first(context.build_tree(self.shape, context.draws(acceptance, noise)))
        return tree.valid.sum(0, keepdim=True)

    def _verify(self, acceptance: Acceptance, key: str, rows: int, randomness: Optional[torch.Tensor] = None):
        """The verify graph of `rows` rows: the first `rows` nodes of the tree drafted under `key`, verified,
        accepted and committed -> the CycleOutput."""
        context = self.context
        tree = tree_rows(self.drafted[key], rows)
        return context.accept_and_commit(acceptance, tree, context.verify(tree), self.shape.depth, randomness)

    def run(self, acceptance: Acceptance, generator) -> CycleRun:
        context = self.context
        noise = context.draft_noise(acceptance, self.shape.expanded_rows, generator)
        key = context.scored_key(f"draft:{acceptance.key}")
        kept = context.graphed(key, partial(self._draft, acceptance, key), *(() if noise is None else (noise,)))
        staged = self.reader.stage(kept)
        self._capture_sizes(acceptance, key)
        kept = self.reader.read(staged, 1)[0]  # the host waits for the drafting here
        rows = verify_size(kept, self.sizes)
        randomness = acceptance.randomness(rows, generator, context.device)
        out = context.graphed(f"{key}:verify@{rows}", partial(self._verify, acceptance, key, rows),
                              *(() if randomness is None else (randomness,)))
        return CycleRun(out, kept - 1, rows)

    def _capture_sizes(self, acceptance: Acceptance, key: str) -> None:
        """At a drafting graph's first cycle, with graphs and no random draws (T=0), every size's verify graph
        captured at once: none is captured later, in the middle of a timed generation."""
        context = self.context
        if not context.graphs.use_graphs or acceptance.temperature > 0 or key in self.captured:
            return
        self.captured.add(key)
        for rows in self.sizes:
            context.graph(f"{key}:verify@{rows}", partial(self._verify, acceptance, key, rows)).ready()
