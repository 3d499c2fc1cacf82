"""Acceptance statistics of decoded cycles, shared by `specdraft bench` and `specdraft eval`."""
from __future__ import annotations

from typing import List, Optional, Sequence


def _reached(accepted: Sequence[int], drafted: Sequence[int], position: int) -> List[int]:
    """The accepted counts of the cycles that drafted `position` (0-based) with every earlier draft accepted."""
    return [a for a, d in zip(accepted, drafted) if a >= position and d > position]


def acceptance_by_position(accepted: Sequence[int], depth: int,
                           drafted: Optional[Sequence[int]] = None) -> List[float]:
    """P(draft i accepted | drafts < i accepted), i = 1..k, over cycles; with `drafted` (chains whose length
    varies per cycle, e.g. under a confidence exit) only over the cycles that drafted position i. A position no
    cycle reached reads 0.0 (`cycles_by_position` tells it apart from a position never accepted)."""
    drafted = [depth] * len(accepted) if drafted is None else drafted
    rates = []
    for position in range(depth):
        reached = _reached(accepted, drafted, position)
        rates.append(sum(1 for a in reached if a > position) / len(reached) if reached else 0.0)
    return rates


def cycles_by_position(accepted: Sequence[int], depth: int,
                       drafted: Optional[Sequence[int]] = None) -> List[int]:
    """How many cycles each rate of `acceptance_by_position` is taken over, i = 1..k (0: no data there)."""
    drafted = [depth] * len(accepted) if drafted is None else drafted
    return [len(_reached(accepted, drafted, position)) for position in range(depth)]
