"""C2T: classifier-pruned draft trees (Huo et al., "C2T: A Classifier-Based Tree Construction Method in
Speculative Decoding", arXiv:2502.13652), an add-on to a trained EAGLE-3 (or PosS) draft.

A tiny classifier (two linear layers, about 250 parameters) decides, node by node while the tree is drafted, which
candidates are worth verifying, from three features that are no hidden state: the joint probability of the
candidate's path, the entropy of its parent's draft distribution (top 1,000) and its depth (`model`). It trains on
traces of the runtime's own tree drafting, every candidate labelled by whether the target accepted it (`traces`,
`specdraft distill-data`); BCE, the best/ snapshot by recall first (the paper's) or AUC (method.best_by). At run
time it is the tree scorer of the base draft's drafter (`export.c2t_runtime`): the candidates it scores below β
(method.threshold, runtime.prune_threshold) are dropped, and the target verifies only the kept ones
(runtime.prune_verify kept: padded to a multiple of 8 rows, decoding/cycles/sized_verify.py); pruning only removes
candidates, so decoding stays lossless. In a chain the same rule ends the drafting (method.chain_threshold).

Beyond the paper: by default (runtime.prune_at selection) the classifier scores the `budget` best candidates of
EAGLE-2's unpruned tree by joint probability and drops those under β with their descendants; with prune_at
expansion it drops each depth's children as they are drafted (the paper's), the frontier of each depth is its
top-k kept candidates by joint probability and the tree verified the `budget` best kept ones (decoding/tree.py).
Drafting runs every depth (static shapes). Traces may come from the tree the classifier will prune
(method.trace_budget: the budget's verified candidates, every rejected one kept, best/ by AUC): on SmolLM2's head
they cost about half the τ of the paper's whole-tree traces at the same cut (docs/benchmarks.md, C2T suite).
"""
from specdraft.methods.base import ExportFormat, MethodSpec, RecordStage
from specdraft.methods.c2t.config import C2TConfig, base_draft_path
from specdraft.methods.c2t.export import c2t_feature_layers, c2t_from_export, c2t_hf_keys, c2t_runtime, c2t_to_hf
from specdraft.methods.c2t.model import C2TClassifier, ClassifierScorer, c2t_loss, collate_traces, draft_digest
from specdraft.methods.c2t.traces import TraceMaker, trace_features, trace_fingerprint

SPEC = MethodSpec(
    name="c2t",
    config=C2TConfig,
    build=C2TClassifier,
    loss=c2t_loss,
    feature_layers=c2t_feature_layers,
    exports={"hf": ExportFormat(write=c2t_to_hf, required_keys=c2t_hf_keys)},
    from_export=c2t_from_export,
    runtime=c2t_runtime,
    base_draft=base_draft_path,
    records=RecordStage(features=trace_features, fingerprint=trace_fingerprint, maker=TraceMaker,
                        collate=collate_traces),
    monitor="best_by",
    reads_embeddings=False,
)

__all__ = ["SPEC", "C2TClassifier", "C2TConfig", "ClassifierScorer", "TraceMaker", "c2t_loss", "collate_traces",
           "draft_digest"]
