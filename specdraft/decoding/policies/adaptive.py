"""The adaptive policy: trees whose depth is chosen cycle by cycle from the acceptance seen so far, DEL's rule
(dynamic_exit.py), which picks a chain's draft length, applied to the tree's depth.

Running per-depth acceptance rates r_i = P(the accepted path reaches depth i | it reached i - 1), exponentially
weighted so that they follow the current context, give the tokens a cycle of depth k emits, E(k) = 1 +
sum_{j<=k} prod_{i<=j} r_i; a cycle costs k * step_cost + 1 (a draft depth's time against the rest of the cycle:
the verify, which is about flat in its rows, and the bookkeeping). Each cycle drafts the depth in
min_depth..the engine's depth of the highest E(k) / cost. So a context the draft predicts well (math, code) gets
deeper trees than the fixed shape's, and one it predicts badly (translation) shallower ones, each at the engine's
top-k and budget.

Unlike the stop rules of cycles/depth_stop.py, nothing is read inside a cycle: each depth's cycle is the fixed tree's
(cycles/tree.py) at that depth, one CUDA graph of its own static shape (every depth's captured at the first cycle of
an acceptance rule, so that none is captured inside a timed generation), and the choice reads only cycles the host
has read, so one cycle stays in flight; the price is a choice one cycle behind. Lossless: the depth changes what is
drafted, never what the target accepts.
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Dict, List, Sequence

from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind
from specdraft.decoding.cycles.tree import TreeCycle
from specdraft.decoding.policies.base import DraftingPolicy, PolicySetup
from specdraft.decoding.policies.dynamic_exit import DynamicExit
from specdraft.decoding.shapes import TreeShape


class AdaptivePolicy(DraftingPolicy):
    """The engine's tree at the depth its acceptance statistics favour, cycle by cycle (module docstring)."""

    reads_every_cycle = False

    def __init__(self, min_depth: int = 2, step_cost: float = 0.045):
        self.min_depth, self.step_cost = min_depth, step_cost

    def bind(self, setup: PolicySetup) -> None:
        super().bind(setup)
        shape, context = setup.shape, setup.context
        if setup.chain is not None or context.tree_start_layer or context.scorer is not None:
            raise SpecdraftError("the adaptive policy chooses a tree's depth: not with a chain (a chain's length is "
                                 "--dynamic-exit's), a tree scorer or --shallow-reuse-tree")
        if not 1 <= self.min_depth <= shape.depth:
            raise SpecdraftError(f"runtime.adaptive_min_depth must be in 1..{shape.depth} (the tree's depth), got "
                                 f"{self.min_depth}")
        self.shapes = {depth: _at_depth(shape, depth) for depth in range(self.min_depth, shape.depth + 1)}
        self.trees = {depth: TreeCycle(context, tree) for depth, tree in self.shapes.items()}
        self.rates = DynamicExit(shape.depth, [self.step_cost], 1.0, min_depth=self.min_depth)
        self.counts = {depth: 0 for depth in self.shapes}
        self.in_flight: deque = deque()  # the depths of the cycles queued and not yet observed
        self.ready_rules: set = set()  # the acceptance rules (keys) whose every depth's graph is captured

    def kinds(self) -> List[CycleKind]:
        return list(self.trees.values())

    def stats(self) -> Dict[str, int]:
        return {f"depth{depth}_cycles": count for depth, count in self.counts.items()}

    def begin(self, tokens: Sequence[int]) -> None:
        self.rates.reset()
        self.in_flight.clear()

    def observe(self, new_tokens: List[int]) -> None:
        if not self.in_flight:  # the prefill's token, which comes before any cycle's
            return
        depth = self.in_flight.popleft()
        self.rates.update(0, depth, len(new_tokens) - 1)

    def next_depth(self) -> int:
        """The depth of the cycle about to be queued (its tokens come to `observe` in queue order)."""
        _, depth = self.rates.choose()
        self.in_flight.append(depth)
        self.counts[depth] += 1
        return depth

    def choose(self, acceptance: Acceptance) -> CycleKind:
        if acceptance.key not in self.ready_rules:
            self.ready_rules.add(acceptance.key)
            for tree in self.trees.values():
                tree.ready(acceptance)
        return self.trees[self.next_depth()]


def _at_depth(shape: TreeShape, depth: int) -> TreeShape:
    """`shape` at `depth`, its budget cut to the candidates that depth has (the deepest is `shape` itself)."""
    deeper = replace(shape, depth=depth)
    return replace(deeper, budget=min(shape.budget, deeper.num_candidates)).validated()
