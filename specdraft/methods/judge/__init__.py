"""Judge decoding (Bachmann et al., "Judge Decoding: Faster Speculative Sampling Requires Going Beyond Model
Alignment", arXiv:2501.19309): a linear head on the target's own last-layer states that accepts a drafted token
exact verification rejects when it still leads to a correct answer. Lossy by design: opt-in at run time
(`runtime.judge_threshold` / `--judge-threshold DELTA`, greedy only), and benched with its quality cost beside its
speedup (`specdraft bench --check-answers`).

An add-on: it serves beside a trained draft (`method.draft`, EAGLE-3, PosS or Kangaroo), whose export it carries.
Its data stage mines labels automatically, as AutoJudge does (arXiv:2504.20039), or reads labels a user supplies
(`mining`), optionally with an earlier judge deciding acceptance in the mining runs (`on_policy`); training fits
the head on those records alone (`model`: balanced loss, accuracy, recall and specificity logged, balanced accuracy
picking best/); the runtime's JudgedGreedy (specdraft.decoding.accept) reads the head's scores in the ordinary
verify pass, trees and chains alike.
"""
from specdraft.methods.base import ExportFormat, MethodSpec, RecordStage
from specdraft.methods.judge.config import JudgeConfig
from specdraft.methods.judge.mining import JudgeMiner, mismatches, record_features, records_fingerprint
from specdraft.methods.judge.on_policy import mining_guide
from specdraft.methods.judge.model import (
    JudgeHead,
    LinearJudge,
    judge_collate,
    judge_from_export,
    judge_loss,
    judge_runtime,
    judge_to_hf,
    label_curve,
    threshold_for_precision,
)

SPEC = MethodSpec(
    name="judge",
    config=JudgeConfig,
    build=JudgeHead,
    loss=judge_loss,
    feature_layers=lambda cfg, target: [],
    exports={"hf": ExportFormat(write=judge_to_hf, required_keys=lambda draft, target: ["proj.weight", "proj.bias"])},
    from_export=judge_from_export,
    runtime=judge_runtime,
    base_draft=lambda cfg: cfg.draft,
    records=RecordStage(features=record_features, fingerprint=records_fingerprint,
                        maker=JudgeMiner, collate=judge_collate, guide=mining_guide),
    monitor="balanced_acc",
    reads_embeddings=False,
)

__all__ = ["SPEC", "JudgeConfig", "JudgeHead", "JudgeMiner", "LinearJudge", "judge_collate", "judge_loss",
           "label_curve", "mismatches", "threshold_for_precision"]
