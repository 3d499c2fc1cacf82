"""Drafting that stops early by a stop rule (stop_rules.py), the svip and ddd policies' shared part: on a chain the
rule becomes the chain's own (cycles/chain.py reads it after each drafted token, in place of η), on a tree each
cycle grows the tree depth by depth until the rule stops it (cycles/depth_stop.py)."""
from __future__ import annotations

from typing import List, Optional

from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind
from specdraft.decoding.cycles.depth_stop import DepthStopCycle
from specdraft.decoding.policies.base import DraftingPolicy, PolicySetup
from specdraft.decoding.stop_rules import StopRule


class StopPolicy(DraftingPolicy):
    """Stop drafting where `rule` says (module docstring)."""

    def __init__(self, rule: StopRule):
        self.rule = rule
        self.kind: Optional[DepthStopCycle] = None

    def bind(self, setup: PolicySetup) -> None:
        super().bind(setup)
        if setup.chain is not None:
            setup.chain.set_stop_rule(self.rule)
            self.reads_every_cycle = False  # the chain reads its flags inside its own cycle
            return
        if setup.context.tree_start_layer:
            raise SpecdraftError(f"the {self.rule.name} policy verifies from layer 0: drop --shallow-reuse-tree")
        self.kind = DepthStopCycle(setup.context, setup.shape, self.rule)

    def kinds(self) -> List[CycleKind]:
        return [self.kind] if self.kind is not None else []

    def choose(self, acceptance: Acceptance) -> CycleKind:
        return self.kind if self.kind is not None else self.setup.base(acceptance)
