"""The judge head and what trains, serves and exports it.

`JudgeHead`: one linear map from the target's last-layer state before the final norm (RMS-normalised here,
without weights, so that its scale does not set the step size) to a logit; its sigmoid is the probability that a
drafted token the target would not have chosen still leads to a correct answer. `LinearJudge` serves it as the
runtime's NodeJudge. The loss is binary cross-entropy with the classes balanced per batch (each class half of
the loss, whatever their counts).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Dict, List

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from specdraft.core.drafting import ExtendedDrafter
from specdraft.core.types import DraftContext, LossOutput, TargetInfo
from specdraft.methods.judge.config import JudgeConfig

RMS_EPS = 1e-6
ARCHITECTURE = "SpecdraftJudgeHead"


def rms_normalised(target_hidden: torch.Tensor) -> torch.Tensor:
    """[N, H] -> [N, H] float32 rows of unit root mean square."""
    states = target_hidden.float()
    return states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + RMS_EPS)


class JudgeHead(nn.Module):
    """hidden [N, H] (the target's last layer, before its final norm) -> logits [N]."""

    def __init__(self, cfg: JudgeConfig, ctx: DraftContext):
        super().__init__()
        self.proj = nn.Linear(ctx.target.hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        object.__setattr__(self, "base", ctx.base)  # not a submodule: the base draft is saved and exported apart

    def forward(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_normalised(target_hidden), self.proj.weight.float(), self.proj.bias.float())[:, 0]


class LinearJudge:
    """A JudgeHead as the runtime's NodeJudge (specdraft.core.drafting): float32 scores in [0, 1]."""

    def __init__(self, head: JudgeHead, threshold: float = 1.0):
        self.head = head
        self.threshold = threshold
        """δ; 1 accepts nothing beyond exact verification (the runtime sets it from runtime.judge_threshold)."""

    def scores(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.head(target_hidden))


def judge_runtime(draft: JudgeHead, cfg: JudgeConfig, target_model) -> ExtendedDrafter:
    """The base draft's own drafter, with the judge beside it."""
    return ExtendedDrafter(draft.base.runtime(target_model), judge=LinearJudge(draft))


def judge_collate(rows: List[Dict]) -> Dict[str, torch.Tensor]:
    """Record rows (one per prompt, each with n labels and n flattened states) -> hidden [N, H], labels [N]."""
    labels = [np.asarray(row["labels"], dtype=np.float32) for row in rows]
    states = [np.asarray(row["hidden"], dtype=np.float32).reshape(len(label), -1)
              for row, label in zip(rows, labels) if len(label)]
    if not states:
        return {"hidden": torch.zeros(0, 0), "labels": torch.zeros(0)}
    return {"hidden": torch.from_numpy(np.concatenate(states)), "labels": torch.from_numpy(np.concatenate(labels))}


def _class_metrics(accepted: torch.Tensor, positive: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Accuracy; where the batch holds the class, recall (positives accepted) and specificity (negatives refused);
    balanced accuracy (the mean of those the batch has: the monitor, so never missing); precision."""
    metrics = {"acc": (accepted == positive).float().mean()}
    if positive.any():
        metrics["recall"] = accepted[positive].float().mean()
    if (~positive).any():
        metrics["specificity"] = (~accepted[~positive]).float().mean()
    metrics["balanced_acc"] = torch.stack([metrics[k] for k in ("recall", "specificity") if k in metrics]).mean()
    if accepted.any():
        metrics["precision"] = positive[accepted].float().mean()
    return metrics


def judge_loss(draft: JudgeHead, batch: Dict[str, torch.Tensor], cfg: JudgeConfig) -> LossOutput:
    """Balanced binary cross-entropy: the mean over positives and the mean over negatives, averaged (a batch
    holding one class alone: that class's mean)."""
    labels = batch["labels"]  # [N]
    if labels.numel() == 0:  # prompts whose drafts were all accepted: nothing to learn from
        return LossOutput(loss=draft.proj.weight.sum() * 0.0)
    logits = draft(batch["hidden"])  # [N]
    per_label = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    positive = labels > 0.5
    parts = [per_label[mask].mean() for mask in (positive, ~positive) if mask.any()]
    metrics = _class_metrics(logits.detach() > 0, positive)
    metrics["positive_share"] = positive.float().mean()
    return LossOutput(loss=torch.stack(parts).mean(), metrics=metrics)


def label_curve(scores: torch.Tensor, labels: torch.Tensor, thresholds: List[float]) -> List[Dict[str, float]]:
    """scores, labels [N] (held-out labels) -> per δ: the share of labels the judge accepts (score > δ), precision
    (positives among them; None when it accepts none), recall (positives accepted) and false accepts."""
    positive = labels > 0.5
    curve = []
    for threshold in thresholds:
        accepted = scores > threshold
        count = int(accepted.sum())
        curve.append({"threshold": threshold, "accepted": count / max(1, len(labels)),
                      "precision": float(positive[accepted].float().mean()) if count else None,
                      "recall": float(accepted[positive].float().mean()) if positive.any() else None,
                      "false_accepts": int((accepted & ~positive).sum())})
    return curve


def threshold_for_precision(scores: torch.Tensor, labels: torch.Tensor, precision: float) -> float:
    """The δ that accepts the most held-out labels (those scored above it) at a precision of at least `precision`:
    the score below the longest run of top scores that keeps it; 1 (nothing beyond exact) when none does."""
    order = torch.argsort(scores, descending=True)
    ranked, hits = scores[order], (labels[order] > 0.5).float()
    kept = torch.cumsum(hits, 0) / torch.arange(1, len(hits) + 1)  # [N] precision of the top k
    distinct = torch.cat([ranked[1:] < ranked[:-1], torch.ones(1, dtype=torch.bool)])  # a cut between scores
    good = torch.nonzero((kept >= precision) & distinct).flatten()
    if len(good) == 0:
        return 1.0
    last = int(good[-1])
    return float(ranked[last + 1]) if last + 1 < len(ranked) else 0.0


def judge_to_hf(draft: JudgeHead, cfg: JudgeConfig, target: TargetInfo, section) -> tuple:
    config = {"architectures": [ARCHITECTURE], "hidden_size": target.hidden_size,
              "specdraft": {"method": "judge", "method_config": asdict(cfg)}}
    return config, {"proj.weight": draft.proj.weight.detach(), "proj.bias": draft.proj.bias.detach()}


def judge_from_export(config: Dict, tensors: Dict[str, torch.Tensor], ctx: DraftContext) -> tuple:
    cfg = JudgeConfig(**config["specdraft"]["method_config"])
    draft = JudgeHead(cfg, ctx)
    draft.load_state_dict({name: tensor.float() for name, tensor in tensors.items()})
    return cfg, draft
