"""C2T's recipe section (`method:`): the draft it prunes the trees of, the classifier's width, its thresholds and
the trees its traces are recorded from."""
from __future__ import annotations

from dataclasses import dataclass

from specdraft.core.errors import SpecdraftError

BEST_BY = ("recall", "auc")
FEATURE_SETS = ("paper", "extended")


@dataclass
class C2TConfig:
    draft: str = ""
    """The trained draft whose trees the classifier prunes: an EAGLE-3 (or PosS) export or run directory. Every
    stage loads it; the export carries a copy."""
    hidden_size: int = 48
    """Width of the classifier's hidden layer (two layers, ReLU, sigmoid output: 241 parameters at 48)."""
    features: str = "paper"
    """What the classifier reads of a candidate: "paper" (its joint probability, its parent's top-1,000 entropy, its
    depth) or "extended" (those, then its own draft probability, its parent's joint probability and its rank among
    its parent's children: all the runtime's scorer has at hand, no hidden state; 385 parameters at 48)."""
    threshold: float = 0.5
    """β for trees, the export's default: candidates the classifier scores below it are dropped
    (runtime.prune_threshold overrides it)."""
    chain_threshold: float = 0.85
    """β for chains: drafting stops at the first token scored below it (an early exit)."""
    trace_depth: int = 11
    """Depth of the trees the traces are recorded from (every candidate verified: no rerank)."""
    trace_topk: int = 10
    """Children per expanded node, and nodes expanded per depth, of those trees."""
    trace_budget: int = 0
    """Nodes of each traced tree the target verifies and the traces label: 0, the whole expansion (the paper's: no
    rerank); B, the B best by joint probability, as the runtime's selection takes them. Give the tree the
    classifier will prune (trace_depth, trace_topk, trace_budget = the runtime's depth, topk, budget) and it learns
    from the candidates it will be asked about: the whole expansion's are mostly deep and improbable, easy negatives
    that teach it little about the budget's tail."""
    negatives_per_positive: float = 1.0
    """Rejected candidates kept per accepted one in each traced tree, drawn at random (at least one a tree)."""
    best_by: str = "recall"
    """Which validation step's classifier becomes best/: "recall" (the paper's: the highest recall at `threshold`,
    then the lowest positive rate; for balanced traces) or "auc" (the best ranking of accepted over rejected
    candidates, whatever β: for traces that keep every rejected candidate, where a classifier that keeps them all
    has the highest recall at any small β)."""

    def __post_init__(self):
        for name in ("threshold", "chain_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise SpecdraftError(f"method.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("hidden_size", "trace_depth"):
            if getattr(self, name) < 1:
                raise SpecdraftError(f"method.{name} must be >= 1, got {getattr(self, name)}")
        if self.trace_topk < 2:
            raise SpecdraftError(f"method.trace_topk must be >= 2 (a tree), got {self.trace_topk}")
        if self.features not in FEATURE_SETS:
            raise SpecdraftError(f"method.features must be one of {', '.join(FEATURE_SETS)}, got {self.features!r}")
        if self.best_by not in BEST_BY:
            raise SpecdraftError(f"method.best_by must be one of {', '.join(BEST_BY)}, got {self.best_by!r}")
        whole = 1 + self.trace_topk + (self.trace_depth - 1) * self.trace_topk ** 2  # the expansion's candidates
        if self.trace_budget != 0 and not 2 <= self.trace_budget <= whole:
            raise SpecdraftError(f"method.trace_budget must be 0 (the whole expansion) or 2..{whole} (the candidates "
                                 f"of trees of trace_depth {self.trace_depth} and trace_topk {self.trace_topk}), got "
                                 f"{self.trace_budget}")
        if self.negatives_per_positive <= 0:
            raise SpecdraftError(f"method.negatives_per_positive must be > 0, got {self.negatives_per_positive}")


def base_draft_path(cfg: C2TConfig) -> str:
    """MethodSpec.base_draft: method.draft, which must name a draft."""
    if not str(cfg.draft or "").strip():
        raise SpecdraftError("method.draft is empty: C2T prunes the trees of a trained draft; name its export or "
                             "run directory (e.g. method.draft=runs/eagle3_smollm2/export)")
    return cfg.draft
