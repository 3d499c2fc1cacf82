"""A drafting policy (`--policy`, runtime.policy) decides, cycle by cycle, which cycle kind the engine runs in place
of its fixed shape's. One module per policy, named as users name it: sam.py (retrieval drafts), svip.py and ddd.py
(drafting that stops early), adaptive.py (each cycle's tree depth); dynamic_exit.py is `--dynamic-exit` (DEL's
chain length). "fixed" is no policy: the engine's own cycle kind every cycle.

The engine calls `bind` once (with what it drafts with: `PolicySetup`), `begin` before each generation, `choose`
for each cycle and `observe` with each cycle's tokens; a policy that reads every cycle's tokens before choosing the
next (`reads_every_cycle`) runs without a cycle in flight. Every policy keeps the engine's acceptance rule, so its
output is the target's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind
from specdraft.decoding.cycles.chain import ChainCycle
from specdraft.decoding.cycles.context import CycleContext
from specdraft.decoding.shapes import TreeShape


@dataclass
class PolicySetup:
    """What a policy binds to: the engine's cycle context, its shape, its own cycle kind for an acceptance rule
    (`base`: the fixed tree or the chain, as the engine would run it), and its chain kind when it drafts chains."""

    context: CycleContext
    shape: TreeShape
    base: Callable[[Acceptance], CycleKind]
    chain: Optional[ChainCycle] = None


class DraftingPolicy:
    reads_every_cycle: bool = True
    """The next cycle depends on this one's tokens (or on host reads inside a cycle): no cycle in flight."""

    def bind(self, setup: PolicySetup) -> None:
        """Bind to an engine's setup; refuses, in one line, what it cannot run with."""
        self.setup = setup

    def kinds(self) -> List[CycleKind]:
        """The cycle kinds of its own it may choose (the engine sizes what the host reads by their most_tokens)."""
        return []

    def extra_rows(self) -> int:
        """Verify rows a cycle may run beyond the shape's budget (cache room)."""
        return 0

    def begin(self, tokens: Sequence[int]) -> None:
        """A new generation's prompt (run while the device prefills it; the first token comes to `observe`)."""

    def observe(self, new_tokens: List[int]) -> None:
        """The tokens the newest cycle emitted, read on the host."""

    def stats(self) -> Dict[str, int]:
        """Counters of what the policy chose, since it was built (bench reports their change)."""
        return {}

    def choose(self, acceptance: Acceptance) -> CycleKind:
        """The cycle kind of the next cycle under `acceptance`."""
        raise NotImplementedError
