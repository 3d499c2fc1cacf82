"""Trees that stop growing early (`DepthStopCycle`): after each depth a stop rule (stop_rules.py; the svip and ddd
policies give theirs) says whether to draft another, and the tree the target verifies holds the depths drafted so
far (at most `budget` nodes).

A CUDA graph has static shapes, so a stop inside one saves nothing: the remaining depths would still run, as
padding. Here each depth is its own graph (the first depth, then one per expansion step), and one more graph per
stopping depth selects, verifies, accepts and commits; the host reads the one stop flag of each depth. The read is
one depth behind the drafting: depth d + 1 is queued before depth d's flag is read, so the device does not wait
for the host between depths; a stop at d wastes that one queued step. What a stop saves: the draft steps past it
and the verify rows of the depths not drafted. What it costs against the fixed tree's single graph: a graph
launch and a flag copy per depth, and no cycle in flight while the host reads the tokens (the engine reads every
cycle of it before queuing the next). `python -m tools.count_cycle_launches --depth-stops` counts both.
"""
from __future__ import annotations

from functools import partial
from typing import Dict, Tuple

import torch

from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind, CycleRun
from specdraft.decoding.cycles.context import CycleContext
from specdraft.decoding.host_reader import HostReader
from specdraft.decoding.sampled_drafts import DraftDraws
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.stop_rules import StopRule
from specdraft.decoding.tree import TreeExpansion


class DepthStopCycle(CycleKind):
    """The tree of `shape`, grown depth by depth until `rule` stops it (module docstring)."""

    reads_every_cycle = True

    def __init__(self, context: CycleContext, shape: TreeShape, rule: StopRule):
        self.context, self.shape, self.rule = context, shape, rule
        self.most_tokens = shape.depth + 1
        self._expansions: Dict[float, TreeExpansion] = {}  # per sampling temperature (0: point-mass drafts)
        self.stops = torch.zeros(shape.depth + 1, dtype=torch.long, device=context.device)  # [D+1]
        self.flags = HostReader(1, context.device)
        vocab = context.d2t.shape[0]  # [R, Vd]: sampled drafts' noise, filled per cycle
        self.noise = torch.zeros(shape.expanded_rows, vocab, device=context.device) if context.sample_drafts else None

    def _expansion(self, temperature: float) -> TreeExpansion:
        """The expansion of cycles at `temperature` (its attributes are the graphs' outputs, so one per graph set)."""
        expansion = self._expansions.get(temperature)
        if expansion is None:
            draws = DraftDraws(temperature, self.noise) if temperature > 0 else None
            expansion = self._expansions[temperature] = self.context.expansion(self.shape, draws)
        return expansion

    # ---- graph bodies ---------------------------------------------------------------------------------------
    def _first(self, expansion: TreeExpansion) -> None:
        expansion.first()
        self.stops[1:2].copy_(self.rule.tree(expansion.logits, expansion.frontiers[1].scores))

    def _advance(self, expansion: TreeExpansion, depth: int) -> None:
        expansion.advance(depth)
        self.stops[depth + 1:depth + 2].copy_(self.rule.tree(expansion.logits, expansion.frontiers[depth + 1].scores))

    def _finish(self, expansion: TreeExpansion, acceptance: Acceptance, depth: int, randomness=None):
        context = self.context
        tree = expansion.select(depth)
        return context.accept_and_commit(acceptance, tree, context.verify(tree), self.shape.depth, randomness)

    # ---- host loop ------------------------------------------------------------------------------------------
    def _run(self, key: Tuple, fn, *args):
        context = self.context
        return context.graphed(context.scored_key(f"depth-stop:{key}"), fn, *args, extra_state=[self.stops])

    def grow(self, expansion: TreeExpansion, sampled: float) -> int:
        """Draft depth by depth until the rule stops the tree -> the depth drafted. sampled: the expansion's
        sampling temperature (0: point masses), which keys its graphs: each expansion has its own."""
        depth_limit = self.shape.depth
        self._run(("first", sampled), partial(self._first, expansion))
        pending = self.flags.stage(self.stops[1:2])
        for depth in range(1, depth_limit):
            self._run(("step", depth, sampled), partial(self._advance, expansion, depth))  # one depth ahead
            following = self.flags.stage(self.stops[depth + 1:depth + 2])
            if self.flags.read(pending, 1)[0]:
                return depth
            pending = following
        return depth_limit

    def run(self, acceptance: Acceptance, generator) -> CycleRun:
        context, shape = self.context, self.shape
        noise = context.draft_noise(acceptance, shape.expanded_rows, generator)
        sampled = acceptance.temperature if noise is not None else 0.0
        expansion = self._expansion(sampled)
        if noise is not None:
            self.noise.copy_(noise)
        depth = self.grow(expansion, sampled)
        nodes = min(shape.budget, candidates_through(shape, depth))
        randomness = acceptance.randomness(nodes, generator, context.device)
        args = () if randomness is None else (randomness,)
        out = self._run(("finish", depth, acceptance.key, sampled),
                        partial(self._finish, expansion, acceptance, depth), *args)
        return CycleRun(out, context.drafted_count(nodes))


def candidates_through(shape: TreeShape, depth: int) -> int:
    """Candidates of depths 0..depth: the root, k at depth 1, k * k at each later one."""
    return 1 + shape.topk + (depth - 1) * shape.topk * shape.topk
