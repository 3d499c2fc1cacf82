"""Trees that stop growing early: after each depth a stop rule (stop_rules.py: SVIP's entropy bound, Dynamic
Depth Decoding's frontier mass) says whether to draft another, and the tree the target verifies holds the
depths drafted so far (at most `budget` nodes).

A CUDA graph has static shapes, so a stop inside one saves nothing: the remaining depths would still run, as
padding. Here each depth is its own graph (the first depth, then one per expansion step), and one more graph per
stopping depth selects, verifies, accepts and commits; the host reads the one stop flag of each depth. The read is
one depth behind the drafting: depth d + 1 is queued before depth d's flag is read, so the device does not wait
for the host between depths; a stop at d wastes that one queued step. What a stop saves: the draft steps past it
and the verify rows of the depths not drafted. What it costs against the fixed tree's single graph: a graph
launch and a flag copy per depth, and no cycle in flight while the host reads the tokens (the engine reads every
cycle of a policy before queuing the next). `tools/count_cycle_launches.py --policy` counts both.
"""
from __future__ import annotations

from functools import partial
from typing import Dict, Tuple

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.drafting_policy import DraftingPolicy
from specdraft.decoding.host_reader import HostReader
from specdraft.decoding.stop_rules import StopRule
from specdraft.decoding.tree import TreeExpansion


class DepthStop(DraftingPolicy):
    """The engine's tree, grown depth by depth until `rule` stops it (module docstring)."""

    def __init__(self, rule: StopRule):
        self.rule = rule
        self._expansions: Dict[float, TreeExpansion] = {}  # per sampling temperature (0: point-mass drafts)

    def attach(self, engine) -> None:
        super().attach(engine)
        if engine.chain is not None:
            raise SpecdraftError(f"the {self.rule.name} policy stops chains through the chain's stop rule, not as "
                                 f"a tree policy")
        if engine.tree_start_layer:
            raise SpecdraftError(f"the {self.rule.name} policy verifies from layer 0: drop --shallow-reuse-tree")
        self.stops = torch.zeros(engine.shape.depth + 1, dtype=torch.long, device=engine.device)  # [D+1]
        self.flags = HostReader(1, engine.device)
        shape, vocab = engine.shape, engine.drafter.d2t.shape[0]  # [R, Vd]: sampled drafts' noise, filled per cycle
        self.noise = torch.zeros(shape.expanded_rows, vocab, device=engine.device) if engine.sample_drafts else None

    def _expansion(self, temperature: float) -> TreeExpansion:
        """The expansion of cycles at `temperature` (its attributes are the graphs' outputs, so one per graph set)."""
        expansion = self._expansions.get(temperature)
        if expansion is None:
            engine = self.engine
            draws = engine.draws(engine.acceptance(temperature), self.noise) if temperature > 0 else None
            expansion = self._expansions[temperature] = self.engine.expansion(draws)
        return expansion

    # ---- graph bodies ---------------------------------------------------------------------------------------
    def _first(self, expansion: TreeExpansion) -> None:
        expansion.first()
        self.stops[1:2].copy_(self.rule.tree(expansion.logits, expansion.frontiers[1].scores))

    def _advance(self, expansion: TreeExpansion, depth: int) -> None:
        expansion.advance(depth)
        self.stops[depth + 1:depth + 2].copy_(self.rule.tree(expansion.logits, expansion.frontiers[depth + 1].scores))

    def _finish(self, expansion: TreeExpansion, policy: Acceptance, depth: int, randomness=None):
        engine = self.engine
        tree = expansion.select(depth)
        return engine.accept_and_commit(policy, tree, engine.verify_forward(tree), randomness)

    # ---- host loop ------------------------------------------------------------------------------------------
    def _run(self, key: Tuple, fn, *args):
        return self.engine.graphed(self.engine.scored_key(f"depth-stop:{key}"), fn, *args, extra_state=[self.stops])

    def grow(self, expansion: TreeExpansion, sampled: float) -> int:
        """Draft depth by depth until the rule stops the tree -> the depth drafted. sampled: the expansion's
        sampling temperature (0: point masses), which keys its graphs: each expansion has its own."""
        depth_limit = self.engine.shape.depth
        self._run(("first", sampled), partial(self._first, expansion))
        pending = self.flags.stage(self.stops[1:2])
        for depth in range(1, depth_limit):
            self._run(("step", depth, sampled), partial(self._advance, expansion, depth))  # one depth ahead
            following = self.flags.stage(self.stops[depth + 1:depth + 2])
            if self.flags.read(pending, 1)[0]:
                return depth
            pending = following
        return depth_limit

    def cycle(self, temperature: float, generator):
        engine = self.engine
        policy = engine.acceptance(temperature)
        noise = engine.draft_noise(policy, engine.shape.expanded_rows, generator)
        sampled = policy.temperature if noise is not None else 0.0
        expansion = self._expansion(sampled)
        if noise is not None:
            self.noise.copy_(noise)
        depth = self.grow(expansion, sampled)
        nodes = min(engine.shape.budget, candidates_through(engine.shape, depth))
        randomness = policy.randomness(nodes, generator, engine.device)
        args = () if randomness is None else (randomness,)
        out = self._run(("finish", depth, policy.key, sampled), partial(self._finish, expansion, policy, depth),
                        *args)
        return out, engine.drafted_count(nodes)


def candidates_through(shape, depth: int) -> int:
    """Candidates of depths 0..depth: the root, k at depth 1, k * k at each later one."""
    return 1 + shape.topk + (depth - 1) * shape.topk * shape.topk
