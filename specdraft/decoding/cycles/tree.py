"""The fixed tree's cycle (`TreeCycle`): the EAGLE-2 tree of one shape drafted from the root (tree.py), verified,
accepted and committed (cycles/context.py), the whole cycle one CUDA graph per acceptance rule and tree scorer.
At T > 0 the graph's random inputs (the acceptance's uniforms, the sampled drafts' Exp(1) noise) are drawn first."""
from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind, CycleRun
from specdraft.decoding.cycles.context import CycleContext
from specdraft.decoding.outputs import CycleOutput
from specdraft.decoding.shapes import TreeShape


class TreeCycle(CycleKind):
    """The cycle of the fixed tree of `shape` (module docstring)."""

    def __init__(self, context: CycleContext, shape: TreeShape):
        self.context, self.shape = context, shape
        self.most_tokens = shape.depth + 1
        self.rows = shape.budget if context.stage is None else shape.depth + 1  # an intermediate's chain: depth + 1

    def key(self, acceptance: Acceptance) -> str:
        shape = self.shape
        return self.context.scored_key(f"cycle:{acceptance.key}:{shape.depth},{shape.topk},{shape.budget}")

    def body(self, acceptance: Acceptance, randomness: Optional[torch.Tensor] = None,
             noise: Optional[torch.Tensor] = None) -> CycleOutput:
        """The graph's body: draft, verify, accept, commit."""
        context = self.context
        tree = context.build_tree(self.shape, context.draws(acceptance, noise))
        return context.accept_and_commit(acceptance, tree, context.verify(tree), self.shape.depth, randomness)

    def run(self, acceptance: Acceptance, generator) -> CycleRun:
        context, budget = self.context, self.shape.budget
        inputs = context.tree_inputs(acceptance, budget, self.shape, generator)
        out = context.graphed(self.key(acceptance), partial(self.body, acceptance), *inputs)
        return CycleRun(out, context.drafted_count(budget), self.rows)

    def ready(self, acceptance: Acceptance) -> None:
        """The graph under `acceptance` captured now (the state left as it was), from example draws: the caller's
        random stream is untouched."""
        context = self.context
        if not context.graphs.use_graphs:
            return
        examples = torch.Generator(device=context.device).manual_seed(0)
        inputs = context.tree_inputs(acceptance, self.shape.budget, self.shape, examples)
        context.graph(self.key(acceptance), partial(self.body, acceptance), example=inputs).ready()
