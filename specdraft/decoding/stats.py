"""Acceptance statistics of decoded cycles, shared by `specdraft bench` and `specdraft eval`."""
from __future__ import annotations

from typing import List, Optional, Sequence


def acceptance_by_position(accepted: Sequence[int], num_draft: int,
                           drafted: Optional[Sequence[int]] = None) -> List[float]:
    """P(draft i accepted | drafts < i accepted), i = 1..k, over cycles; with `drafted` (chains whose length
    varies per cycle, e.g. under a confidence exit) only over the cycles that drafted position i."""
    drafted = [num_draft] * len(accepted) if drafted is None else drafted
    rates = []
    for position in range(num_draft):
        reached = [a for a, d in zip(accepted, drafted) if a >= position and d > position]
        rates.append(sum(1 for a in reached if a > position) / len(reached) if reached else 0.0)
    return rates
