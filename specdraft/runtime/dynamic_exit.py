"""Dynamic draft length from acceptance statistics gathered while decoding, after DEL ("Context-Aware Dynamic
Exit Layer for Efficient Self-Speculative Decoding", Zarch et al., 2025). Off by default (`--dynamic-exit`).

DEL picks, per context, the exit layer and the speculation length that maximise tokens per layer run. Here:
running per-position acceptance rates r_i = P(draft i accepted | drafts < i accepted), exponentially weighted
so that they follow the current context, give the expected tokens a cycle of k drafts emits,
E(k) = 1 + sum_{j<=k} prod_{i<=j} r_i; a cycle costs k * draft_cost + verify_cost target-layer equivalents
(a Kangaroo draft step: ℓ layers + the adapter; its verify: the L - ℓ layers above the exit, L without shallow
reuse). `choose` returns the k in 1..K of the highest E(k) / cost(k); the confidence exit η may still stop a
cycle earlier. Positions a cycle did not reach drift back toward the prior, so a length cut after a bad stretch
is tried again later.

Missing: the exit-layer half of DEL. Choosing ℓ per context needs several drafts at different ℓ in one engine
(each with its own adapter cache fed at its own feature layer, and verification starting at the chosen ℓ), or
DEL's shadow-token statistics of every layer; the engine holds one drafter, so ℓ is fixed by the export.
"""
from __future__ import annotations

from typing import List


class DynamicExit:
    def __init__(self, max_depth: int, draft_cost: float, verify_cost: float, decay: float = 0.9,
                 prior: float = 0.7, drift: float = 0.02):
        """draft_cost, verify_cost: target-layer equivalents per draft step and per verify pass; decay: weight
        of the history in each rate update; prior: the rates before any cycle; drift: the pull of an unreached
        position's rate back toward the prior, per cycle."""
        self.max_depth, self.draft_cost, self.verify_cost = max_depth, draft_cost, verify_cost
        self.decay, self.prior, self.drift = decay, prior, drift
        self.reset()

    def reset(self) -> None:
        """Forget the statistics (a new context)."""
        self.rates: List[float] = [self.prior] * self.max_depth  # r_1..r_K

    def expected_tokens(self, depth: int) -> float:
        """E(k): tokens a cycle of `depth` drafts emits (accepted drafts + the bonus)."""
        total, alive = 1.0, 1.0
        for rate in self.rates[:depth]:
            alive *= rate
            total += alive
        return total

    def tokens_per_cost(self, depth: int) -> float:
        return self.expected_tokens(depth) / (depth * self.draft_cost + self.verify_cost)

    def choose(self) -> int:
        """The draft length of the next cycle, 1..K."""
        return max(range(1, self.max_depth + 1), key=self.tokens_per_cost)

    def update(self, drafted: int, accepted: int) -> None:
        """A cycle drafted `drafted` tokens, of which the first `accepted` were accepted."""
        for position in range(self.max_depth):  # position i-1 holds r_i
            if position < accepted:
                outcome = 1.0
            elif position == accepted and accepted < drafted:
                outcome = 0.0
            else:
                self.rates[position] += self.drift * (self.prior - self.rates[position])
                continue
            self.rates[position] = self.decay * self.rates[position] + (1 - self.decay) * outcome
