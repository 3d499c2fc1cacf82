"""C2T's classifier, its loss and the runtime's tree scorer over it.

The classifier reads three features of a drafted candidate, none of them a hidden state (so one classifier
serves every prompt and dataset of its draft): the joint probability of its path (the product of the draft's
probabilities from the root), the entropy of its parent's draft distribution over its 1,000 most probable tokens,
and its depth (1-based). Two linear layers with a ReLU between them give one logit; sigmoid(logit) >= β keeps the
candidate. Traces record, and training reads, what `kernels.prune_children` computes at run time (`child_inputs`,
then `ffn_features`): one computation of the features for both.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext, LossOutput
from specdraft.kernels.prune_children import (EXTENDED_FEATURES, PAPER_FEATURES, ScorerWeights, ffn_features,
                                              prune_children)
from specdraft.methods.c2t.config import C2TConfig
from specdraft.methods.shared import draft_digest

ENTROPY_TOP = 1000
"""M: the parent entropy is over its draft distribution's M most probable tokens (renormalised)."""


def num_features(cfg: C2TConfig) -> int:
    return EXTENDED_FEATURES if cfg.features == "extended" else PAPER_FEATURES


def candidate_features(joint_logprobs: torch.Tensor, parent_entropy: torch.Tensor, depths: torch.Tensor,
                       own_logprobs: Optional[torch.Tensor] = None,
                       ranks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """joint_logprobs, parent_entropy, depths [n] (as traces record them; with own_logprobs and ranks, the extended
    set) -> the classifier's input [n, 3 or 6] float32 (`kernels.prune_children.ffn_features`, what the runtime
    scores: the parent's joint log-probability is the joint less the candidate's own)."""
    if own_logprobs is None:
        return ffn_features(joint_logprobs, parent_entropy, depths)
    return ffn_features(joint_logprobs, parent_entropy, depths, own_logprobs, joint_logprobs - own_logprobs, ranks)


def feature_scale(cfg: C2TConfig) -> torch.Tensor:
    """[3 or 6]: what the classifier multiplies its features by first, so that each spans about [0, 1] (the
    probabilities as they are, the entropy over ln M, the depth over the traced trees' depth, the rank over their
    top-k). Unscaled, the depth
    (up to 11) and the entropy (up to 6.9) swamp the joint probability, and Adam at 1e-3 takes far more steps
    than a few hundred to undo it (on synthetic trees, a few hundred steps left the classifier ranking the
    candidates a tree verifies worse than their joint probability alone does)."""
    paper = [1.0, 1.0 / math.log(ENTROPY_TOP), 1.0 / cfg.trace_depth]
    return torch.tensor(paper if cfg.features == "paper" else [*paper, 1.0, 1.0, 1.0 / cfg.trace_topk])


class C2TClassifier(nn.Module):
    """The trained part of a C2T draft: [n, F] features (F: num_features) -> [n] logits. `base` (not a submodule:
    saved apart) is the draft whose trees it prunes. `feature_scale` (a buffer, exported) scales the features before
    the first layer."""

    def __init__(self, cfg: C2TConfig, ctx: DraftContext):
        super().__init__()
        self.hidden = nn.Linear(num_features(cfg), cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, 1)
        self.register_buffer("feature_scale", feature_scale(cfg))
        object.__setattr__(self, "base", ctx.base)

    @functools.cached_property
    def base_digest(self):
        """The base draft's weights' digest (None without a base), computed when training first checks a batch's
        traces (as loaded: the runtime moves the base to its device and dtype in place)."""
        return draft_digest(self.base.draft) if self.base is not None else None

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # [n, >= F] -> [n]
        features = features[:, :self.hidden.in_features]  # a batch holds every feature its traces record
        return self.out(torch.relu(self.hidden(features * self.feature_scale)))[:, 0]

    def input_layer(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The first layer over the unscaled features, the scale folded in -> (weight [Hc, F], bias [Hc]): what the
        runtime's kernel applies."""
        return self.hidden.weight * self.feature_scale[None, :], self.hidden.bias


def _check_traces(classifier: C2TClassifier, batch: Dict) -> None:
    """Every row of the batch was recorded over the draft this classifier prunes, and holds the features it reads,
    or one line naming what is missing."""
    wanted, held = classifier.hidden.in_features, batch["features"].shape[1]
    if held < wanted:
        raise SpecdraftError(f"these trace rows hold {held} features of a candidate; method.features=extended reads "
                             f"{wanted}: record the traces again with `specdraft distill-data` into a new "
                             f"distill.output_dir")
    if classifier.base_digest is None:
        return
    for source, digest in zip(batch["drafts"], batch["draft_digests"]):
        if digest != classifier.base_digest:
            raise SpecdraftError(
                f"trace rows recorded over draft {source} (weights {digest}) cannot train a classifier for "
                f"method.draft {classifier.base.source} (weights {classifier.base_digest}); record its traces with "
                f"`specdraft distill-data` into a new distill.output_dir")


def ranking_auc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """scores, labels [n] -> the probability that an accepted candidate outscores a rejected one (ROC AUC; ties
    broken by position), whatever β: how well the classifier ranks, apart from where β cuts."""
    ranks = scores.argsort().argsort().float() + 1  # [n] 1..n
    accepted = labels > 0.5
    positives, negatives = accepted.sum(), (~accepted).sum()
    return (ranks[accepted].sum() - positives * (positives + 1) / 2) / (positives * negatives).clamp(min=1)


def c2t_loss(classifier: C2TClassifier, batch: Dict, cfg: C2TConfig) -> LossOutput:
    """Binary cross-entropy of the accepted label; metrics at β = method.threshold: recall (accepted candidates
    kept), positive_rate (candidates kept), accuracy; `auc` (ranking_auc); and `best_by`, what picks the best/
    snapshot (method.best_by): recall then the lowest positive rate (recall - 1e-3 x positive rate, the paper's),
    or the AUC."""
    _check_traces(classifier, batch)
    features, labels = batch["features"], batch["labels"]  # [n, 6] (or [n, 3]), [n]
    logits = classifier(features)
    if labels.numel() == 0:  # rows without a traced tree (an answer that ended at once)
        zero = logits.sum()
        return LossOutput(loss=zero, metrics={"best_by": zero.detach()})
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    with torch.no_grad():
        kept, accepted = torch.sigmoid(logits) >= cfg.threshold, labels > 0.5
        recall = (kept & accepted).sum() / accepted.sum().clamp(min=1)
        positive_rate = kept.float().mean()
        auc = ranking_auc(logits, labels)
        metrics = {"recall": recall, "positive_rate": positive_rate,
                   "accuracy": (kept == accepted).float().mean(), "auc": auc,
                   "best_by": auc if cfg.best_by == "auc" else recall - 1e-3 * positive_rate}
    return LossOutput(loss=loss, metrics=metrics)


def logit(probability: float) -> float:
    """The logit whose sigmoid is `probability` (±inf at 0 and 1)."""
    if probability <= 0.0:
        return -math.inf
    if probability >= 1.0:
        return math.inf
    return math.log(probability / (1.0 - probability))


class ClassifierScorer:
    """The runtime's TreeScorer (core/drafting.py) over a trained classifier, in float32 on the engine's device: a
    depth's pruning is one launch (`kernels.prune_children`: the parents' entropies, the FFN and the cut), with no
    host sync. β lives in a device tensor (as its logit), so a new threshold reaches CUDA graphs captured before."""

    def __init__(self, classifier: C2TClassifier, cfg: C2TConfig, device: torch.device):
        as32 = dict(device=device, dtype=torch.float32)
        hidden_weight, hidden_bias = classifier.input_layer()
        self.weights = ScorerWeights(hidden_weight=hidden_weight.detach().to(**as32).contiguous(),
                                     hidden_bias=hidden_bias.detach().to(**as32).contiguous(),
                                     out_weight=classifier.out.weight.detach()[0].to(**as32).contiguous(),
                                     out_bias=classifier.out.bias.detach().to(**as32),
                                     cut=torch.zeros(1, **as32))  # logit(β)
        self.threshold = cfg.threshold
        self.chain_threshold = cfg.chain_threshold

    @property
    def threshold(self) -> float:
        return self._threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise SpecdraftError(f"the prune threshold must be in [0, 1], got {value}")
        self._threshold = float(value)
        self.weights.cut.fill_(logit(self._threshold))

    def prune(self, child_logprobs: torch.Tensor, parent_scores: torch.Tensor, parent_logits: torch.Tensor,
              depth: int) -> torch.Tensor:
        return prune_children(child_logprobs, parent_scores, parent_logits, depth, self.weights, ENTROPY_TOP)


def collate_traces(rows: List[Dict]) -> Dict:
    """Trace rows (one a prompt, list columns: traces.py) -> {features [n, 6] (the extended set; [n, 3] for rows
    recorded without a candidate's own log-probability and rank), labels [n] float32, and each row's draft and its
    digest (lists)}: every kept candidate of every row, in order."""
    def column(name, dtype):
        parts = [torch.tensor(row[name], dtype=dtype).reshape(-1) for row in rows]  # a copy: arrays read-only
        return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)

    extended = () if rows and "logprob" not in rows[0] else (column("logprob", torch.float32),
                                                                column("rank", torch.float32))
    features = candidate_features(column("joint_logprob", torch.float32), column("entropy", torch.float32),
                                  column("depth", torch.float32), *extended)
    return {"features": features, "labels": column("label", torch.float32),
            "drafts": [str(row["draft"]) for row in rows], "draft_digests": [str(row["draft_digest"]) for row in rows]}
