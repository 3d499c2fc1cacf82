"""The drafted shape (`TreeShape`) and the runtime's default shapes, in this one place: the runtime's settings
(`runtime.depth`, `topk`, `budget`, `chain`) leave them None to take these, and the command line's help prints
them from here (`shape_defaults`). No torch at import: the CLI reads this module.

- `TreeShape()`: the tree at T=0 when no shape is asked for (its field defaults).
- `SAMPLING_TREE`: the tree at T > 0 when no shape is asked for: where sampling accepts fewer drafts, a smaller
  tree's shorter cycle pays more than the default's deeper paths (docs/benchmarks.md, runtime suite).
- `CHAIN_DEPTH`: a chain's drafts when none are asked for.
- `ADAPTIVE_DEPTH`: the adaptive policy's deepest tree when runtime.depth is unset: at top-8, the deepest whose
  scratch slots fit the tree-attention kernel's window.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from specdraft.core.errors import SpecdraftError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TreeShape:
    depth: int = 5
    """Drafted tokens on the longest path. The defaults were the fastest of the shapes the runtime suite measured
    on SmolLM2 with two EAGLE-3 heads (docs/benchmarks.md)."""
    topk: int = 8
    """Children proposed per expanded node, and nodes expanded per depth."""
    budget: int = 40
    """Nodes the target verifies, the root included."""

    def validated(self) -> "TreeShape":
        """The shape, or one line naming what is out of range; a warning where the tree-attention kernel's window
        cannot hold it (attention then runs its PyTorch reference, far slower a cycle)."""
        from specdraft.kernels.tree_attention import MAX_WINDOW  # torch: only where a shape is checked

        if self.depth < 1 or self.topk < 1:
            raise SpecdraftError(f"tree depth and topk must be >= 1, got depth={self.depth} topk={self.topk}")
        if not 2 <= self.budget <= self.num_candidates:
            raise SpecdraftError(f"tree budget must be in 2..{self.num_candidates} for depth={self.depth} "
                                 f"topk={self.topk}, got {self.budget}")
        if max(self.budget, self.scratch) > MAX_WINDOW:
            logger.warning("tree depth=%d topk=%d budget=%d: the verify's %d nodes and the draft's %d scratch slots "
                           "must each be <= %d for the tree-attention kernel; beyond, attention runs its PyTorch "
                           "reference, far slower a cycle", self.depth, self.topk, self.budget, self.budget,
                           self.scratch, MAX_WINDOW)
        return self

    @classmethod
    def chain(cls, depth: int) -> "TreeShape":
        """A chain of `depth` drafts: top-1 at each depth, the root and its drafts verified."""
        return cls(depth=depth, topk=1, budget=depth + 1)

    @property
    def num_candidates(self) -> int:  # root + depth-1 tokens + k*k per later depth
        return 1 + self.topk + (self.depth - 1) * self.topk * self.topk

    @property
    def scratch(self) -> int:  # draft scratch slots: root + k per expanded depth
        return 1 + self.depth * self.topk

    @property
    def expanded_rows(self) -> int:  # nodes the expansion runs the draft on: the root + k per later depth
        return 1 + (self.depth - 1) * self.topk


SAMPLING_TREE = TreeShape(depth=3, topk=6, budget=16)
CHAIN_DEPTH = 6
ADAPTIVE_DEPTH = 7


def shape_defaults() -> str:
    """The default shapes in words (the command line's help for the shape settings)."""
    tree, sampled = TreeShape(), SAMPLING_TREE
    return (f"default shape: a tree ({tree.depth}, {tree.topk}, {tree.budget}) at T=0 and ({sampled.depth}, "
            f"{sampled.topk}, {sampled.budget}) at T > 0 when none of depth, topk and budget is given, a chain of "
            f"{CHAIN_DEPTH}, the adaptive policy's deepest tree {ADAPTIVE_DEPTH}")
