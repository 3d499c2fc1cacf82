"""A drafting policy decides, cycle by cycle, what the engine drafts and verifies in place of its fixed shape:
retrieval drafts from a suffix automaton (retrieval_cycles.py), trees that stop growing early (depth_stop.py).
The engine calls `attach` once, `begin` before each generation, `cycle` for each cycle and `observe` with each
cycle's tokens; a policy that reads every cycle's tokens before choosing the next (`reads_every_cycle`) runs
without a cycle in flight. Every policy keeps the engine's acceptance rule, so its output is the target's."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple


class DraftingPolicy:
    reads_every_cycle: bool = True
    """The next cycle depends on this one's tokens (or on host reads inside a cycle): no cycle in flight."""

    def attach(self, engine) -> None:
        """Bind to a SpecEngine (its shape, drafter, device); refuses, in one line, what it cannot run with."""
        self.engine = engine

    def max_depth(self) -> int:
        """The deepest drafted path a cycle may verify (so a cycle emits at most max_depth + 1 tokens)."""
        return self.engine.shape.depth

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

    def cycle(self, temperature: float, generator) -> Tuple[object, int]:
        """One cycle -> (the engine's CycleOutput, drafted tokens verified)."""
        raise NotImplementedError
