"""Dynamic exit layer and draft length from acceptance statistics gathered while decoding, after DEL
("Context-Aware Dynamic Exit Layer for Efficient Self-Speculative Decoding", Zarch et al., 2025). Off by default
(`--dynamic-exit`, a research option: docs/runtime.md); the exit-layer choice needs several drafts at different exit
layers (`--more-exits`). The chain cycle (cycles/chain.py) asks `DynamicExit.choose` before each cycle and tells it
what the host read after.

DEL picks, per context, the exit layer and the speculation length that maximise tokens per layer run. Here,
per exit e (one per draft): running per-position acceptance rates r_{e,i} = P(draft i accepted | drafts < i
accepted), exponentially weighted so that they follow the current context, give the tokens a cycle of k drafts
emits, E_e(k) = 1 + sum_{j<=k} prod_{i<=j} r_{e,i}; a cycle costs k * draft_cost_e + verify_cost target-layer
equivalents (a Kangaroo draft step: ℓ layers + the adapter; its verify: the L - ℓ layers above the exit, L
without shallow reuse). `choose` returns the (e, k), k in 1..K, of the highest E_e(k) / cost; the confidence exit
η may still stop a cycle earlier. Rates a cycle did not observe (positions it did not reach, exits it did not
use) drift back toward the prior, so an exit or a length dropped after a bad stretch is tried again later.

`ExitChoice` is the drafter for several drafts at different exit layers over one target (Kangaroo exports at
several ℓ): every draft ingests the accepted tokens (each reads the feature at its own ℓ), the chosen one
drafts. They share one verify, which starts at the lowest ℓ: the chosen draft keeps its chain's states at that
layer while it runs its own deeper shallow layers. The price: a cycle drafted at a deeper ℓ reruns the layers
between the lowest ℓ and its own in the verify. DEL's shadow-token statistics (the acceptance every layer would
have had, from one pass) are not built: an exit's statistics come from the cycles that used it.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from specdraft.core.drafting import Drafter, DrafterCaps
from specdraft.core.errors import SpecdraftError


class DynamicExit:
    def __init__(self, max_depth: int, draft_costs: Sequence[float], verify_cost: float, decay: float = 0.9,
                 prior: float = 0.7, drift: float = 0.02, min_depth: int = 1):
        """draft_costs: the cost of a draft step of each exit, in the unit of verify_cost, a verify pass's;
        decay: weight of the history in each rate update; prior: the rates before any cycle; drift: the pull of
        an unobserved rate back toward the prior, per cycle; min_depth: the shortest draft `choose` offers."""
        self.max_depth, self.draft_costs, self.verify_cost = max_depth, list(draft_costs), verify_cost
        self.min_depth = min_depth
        self.decay, self.prior, self.drift = decay, prior, drift
        self.reset()

    def reset(self) -> None:
        """Forget the statistics (a new context)."""
        self.rates: List[List[float]] = [[self.prior] * self.max_depth for _ in self.draft_costs]  # [exit][i-1]

    def expected_tokens(self, exit_index: int, depth: int) -> float:
        """E_e(k): tokens a cycle of `depth` drafts at exit e emits (accepted drafts + the bonus)."""
        total, alive = 1.0, 1.0
        for rate in self.rates[exit_index][:depth]:
            alive *= rate
            total += alive
        return total

    def tokens_per_cost(self, exit_index: int, depth: int) -> float:
        cost = depth * self.draft_costs[exit_index] + self.verify_cost
        return self.expected_tokens(exit_index, depth) / cost

    def choose(self) -> Tuple[int, int]:
        """(exit, draft length min_depth..K) of the next cycle."""
        options = [(e, k) for e in range(len(self.draft_costs)) for k in range(self.min_depth, self.max_depth + 1)]
        return max(options, key=lambda option: self.tokens_per_cost(*option))

    def update(self, exit_index: int, drafted: int, accepted: int) -> None:
        """A cycle at exit `exit_index` drafted `drafted` tokens, of which the first `accepted` were accepted."""
        for index, rates in enumerate(self.rates):
            for position in range(self.max_depth):  # position i-1 holds r_i
                observed = index == exit_index and (position < accepted or position == accepted < drafted)
                if observed:
                    rates[position] = self.decay * rates[position] + (1 - self.decay) * (position < accepted)
                else:
                    rates[position] += self.drift * (self.prior - rates[position])


class ExitChoice(Drafter):
    """Drafts at several exit layers over one target, one drafting per cycle (module docstring). A Drafter
    (core/drafting.py) with the shallow-reuse hooks; `select_exit` switches drafts between cycles."""

    def __init__(self, drafters: Sequence[Drafter]):
        shallow = [d for d in drafters if d.caps.shallow_layers]
        if len(shallow) < len(drafters):
            raise SpecdraftError("--more-exits takes drafts that run the target's own shallow layers (Kangaroo)")
        self.drafters = sorted(drafters, key=lambda d: d.caps.shallow_layers)
        self.verify_start_layer = self.drafters[0].caps.shallow_layers
        for drafter in self.drafters:
            drafter.set_verify_start_layer(self.verify_start_layer)
        self.feature_layers = sorted({layer for d in self.drafters for layer in d.feature_layers})
        first = self.drafters[0].caps
        self.caps = DrafterCaps(shallow_layers=first.shallow_layers, exit_threshold=first.exit_threshold,
                                draft_cost_layers=first.draft_cost_layers,
                                exit_layers=tuple(d.caps.shallow_layers for d in self.drafters),
                                exit_costs=tuple(float(d.caps.draft_cost_layers) for d in self.drafters))
        self.variant = 0  # the drafting draft; CUDA graphs are captured per variant

    @property
    def active(self):
        return self.drafters[self.variant]

    @property
    def d2t(self) -> torch.Tensor:
        return self.active.d2t

    def select_exit(self, index: int) -> None:
        self.variant = index

    def allocate(self, max_len, scratch, device, dtype) -> None:
        for drafter in self.drafters:
            drafter.allocate(max_len, scratch, device, dtype)

    def state_tensors(self):
        return [t for d in self.drafters for t in d.state_tensors()]

    def begin(self, context) -> None:
        for drafter in self.drafters:
            drafter.begin(context)

    def ingest(self, features, next_tokens, start, count) -> None:
        for drafter in self.drafters:
            drafter.ingest(features, next_tokens, start, count)

    def ingest_prompt(self, features, next_tokens, start, count) -> None:
        for drafter in self.drafters:
            drafter.ingest_prompt(features, next_tokens, start, count)

    def first(self, root_token, position):
        return self.active.first(root_token, position)

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        return self.active.step(depth, hidden, tokens, positions, scratch_slots, scratch_visible)

    def chain_verify_states(self, tokens, positions, computed: int):
        return self.active.chain_verify_states(tokens, positions, computed)


def dynamic_exit_for(caps: DrafterCaps, depth: int, layers_above: int) -> DynamicExit:
    """DEL's cost model in target-layer equivalents: a draft step at each exit the drafter offers (`exit_costs`,
    else its one `draft_cost_layers`), and a verify of the `layers_above` layers above the shallow ones."""
    return DynamicExit(depth, list(caps.exit_costs) or [caps.draft_cost_layers], float(layers_above))
