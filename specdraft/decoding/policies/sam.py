"""The sam policy (SAM-Decoding, Hu et al., arXiv:2411.10666): before each cycle the host asks the suffix automaton
(suffix_automaton.py) for the tokens that followed the longest earlier occurrence of the text's newest suffix;
when that match is at least `min_match` tokens long, the cycle verifies them (cycles/retrieval.py: alone, or
grafted onto the model's tree with `merge`), else the engine's own cycle runs. The automaton runs on the host
between cycles, so the engine reads every cycle before queuing the next."""
from __future__ import annotations

from typing import Dict, List, Sequence

from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind
from specdraft.decoding.cycles.retrieval import RetrievalCycle
from specdraft.decoding.policies.base import DraftingPolicy, PolicySetup
from specdraft.decoding.policies.suffix_automaton import Retrieval


class SamPolicy(DraftingPolicy):
    """Retrieval cycles when the match is long enough, the engine's own otherwise (module docstring)."""

    def __init__(self, retrieval: Retrieval, merge: bool = False):
        self.retrieval, self.merge = retrieval, merge
        self.counts: Dict[str, int] = {"retrieval": 0, "model": 0}  # cycles of each kind, since construction

    def bind(self, setup: PolicySetup) -> None:
        super().bind(setup)
        if self.merge and setup.chain is not None:
            raise SpecdraftError("sam_merge grafts the retrieval draft onto a tree; a chain verifies it alone "
                                 "(set sam_merge false, or draft a tree)")
        if self.merge and setup.context.tree_start_layer:
            raise SpecdraftError("sam_merge verifies from layer 0: drop --shallow-reuse-tree")
        self.kind = RetrievalCycle(setup.context, setup.shape, self.retrieval.draft_len, self.merge)

    def kinds(self) -> List[CycleKind]:
        return [self.kind]

    def extra_rows(self) -> int:
        return self.retrieval.draft_len

    def stats(self) -> Dict[str, int]:
        return {f"{kind}_cycles": count for kind, count in self.counts.items()}

    def begin(self, tokens: Sequence[int]) -> None:
        self.retrieval.reset(tokens)

    def observe(self, new_tokens: List[int]) -> None:
        self.retrieval.extend(new_tokens)

    def choose(self, acceptance: Acceptance) -> CycleKind:
        tokens = self.retrieval.draft()
        if not tokens:
            self.counts["model"] += 1
            return self.setup.base(acceptance)
        self.counts["retrieval"] += 1
        self.kind.load(tokens)
        return self.kind
