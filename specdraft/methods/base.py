"""What every method gives the generic trainer, exporter, evaluator and runtime: a `MethodSpec` of plain
functions.

The Lightning module, the CLI, the exporter, the evaluator, the runtime and the data stage only call these hooks;
none of them branches on a method's name. A new method that needs something else from them adds a hook here.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

import torch
from torch import nn

from specdraft.core.drafting import Drafter, IntermediateModel
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import BaseDraft, DraftBatch, DraftContext, LossOutput, TargetInfo


@dataclass(frozen=True)
class ExportFormat:
    """One on-disk layout a serving engine loads: `write(draft, cfg, target, target_ref)` -> (config, tensors)."""

    write: Callable[..., Tuple[Dict[str, Any], Dict[str, torch.Tensor]]]
    required_keys: Callable[[Any, TargetInfo], List[str]]
    """Weight names that must be present; the exporter fails loudly if one is missing."""


@dataclass
class RecordContext:
    """What a method's data stage is given: the frozen target (model, tokenizer, geometry), the base draft it
    extends (if any), the device, the recipe's distill and data sections, and a progress callback (one call per
    conversation done)."""

    target: Any
    base: Optional[BaseDraft]
    device: str
    distill: Any
    data: Any
    progress: Callable[[int], None]
    guide: Optional[BaseDraft] = None
    """A trained draft of the method itself that its records are made with (RecordStage.guide), loaded."""


class RecordMaker(Protocol):
    def records(self, conversations: Dict[int, Any]) -> Tuple[List[dict], List[dict]]:
        """{position: Conversation} of one shard -> (record rows, problems): every conversation yields rows or a
        problem (`specdraft.distill.run.problem_entry`), so a shard's counts add up (ok + error + skipped = input)."""


@dataclass(frozen=True)
class RecordStage:
    """A method trained on records its own data stage makes (tree traces, mined labels) rather than on regenerated
    conversations with the target's features. `specdraft distill-data` writes them with text distillation's
    shards, resume and accounting; `specdraft train` reads them back without loading the target."""

    features: Callable[[], Any]
    """() -> the `datasets.Features` of one record row (the shards' schema); a function, so that registering the
    method imports no `datasets` (the runtime runs without the trainer's dependencies)."""
    fingerprint: Callable[[Any], Dict[str, Any]]
    """cfg -> the settings that make two runs' records interchangeable (besides the prompts and the target)."""
    maker: Callable[[Any, RecordContext], RecordMaker]
    """(cfg, ctx) -> the object that turns a shard's conversations into records (loaded once per run)."""
    collate: Callable[[List[Dict[str, Any]]], Dict[str, torch.Tensor]]
    """Record rows -> one batch for the method's loss (the loss receives this dict, not a DraftBatch)."""
    guide: Optional[Callable[[Any], Optional[Tuple[str, str]]]] = None
    """cfg -> (its recipe key, the export or run directory) of a trained draft of this same method that the data
    stage makes records with (the judge's method.mine_judge: on-policy mining), or None. The data stage loads it,
    checked against the target, into RecordContext.guide."""


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config: type
    """The method's config dataclass (the recipe's `method` section)."""
    build: Callable[[Any, DraftContext], nn.Module]
    """(cfg, ctx) -> the trainable draft module."""
    loss: Callable[[nn.Module, DraftBatch, Any], LossOutput]
    """(draft, batch with features, cfg) -> loss and metrics (acc@k, tau_sim)."""
    feature_layers: Callable[[Any, TargetInfo], List[int]]
    """(cfg, target) -> hidden-state indices the draft reads (see TargetFeatures.hidden_states)."""
    exports: Dict[str, ExportFormat]
    """Export formats by name (`hf`, `speculators`, ...)."""
    runtime: Callable[[nn.Module, Any, Any], Drafter]
    """(draft, cfg, runtime target model) -> the runtime's drafter (specdraft.core.drafting). The evaluator and
    the runtime both draft through it: a method writes its inference once."""
    from_export: Optional[Callable[[Dict[str, Any], Dict[str, torch.Tensor], DraftContext], Tuple[Any, nn.Module]]] \
        = None
    """(config.json, tensors, ctx) of an `hf` export -> (cfg, draft) ready for evaluation (ctx.target: the
    geometry it was trained for; ctx.base: the draft an add-on extends). None: `read_export`, the method's
    config from the export's saved method_config, built and loaded (`export_config`, `export_requires` and
    `export_tensors` adjust it)."""
    export_config: Optional[Callable[[Dict[str, Any]], Any]] = None
    """The default from_export's cfg for an export that saved no method_config: config.json -> cfg from the keys of
    a checkpoint written elsewhere (EAGLE-3: SGLang's); None refuses such an export."""
    export_requires: Tuple[str, ...] = ()
    """Fields a saved method_config must hold for the default from_export to read it as this method's (PosS:
    num_specialists, which an EAGLE-3 method_config lacks but PosS's defaults would fill)."""
    export_tensors: Optional[Callable[[Dict[str, torch.Tensor], nn.Module], Dict[str, torch.Tensor]]] = None
    """The default from_export's (an export's tensors, the built draft) -> the state dict loaded strictly into it
    (EAGLE-3: vLLM's layer names mapped back, tensors the head does not hold dropped); None: the tensors as read."""
    intermediate: Optional[Callable[[nn.Module, Any, Any], IntermediateModel]] = None
    """(draft, cfg, runtime target model) -> this draft as the small model of hierarchical drafting, which checks
    another draft's tree before the target verifies the sequence it keeps (runtime.intermediate names its export);
    None: it cannot serve as one."""
    warm_start: Optional[Callable[[Any], Optional[str]]] = None
    """cfg -> the run directory or export whose trained draft starts this one (None: random weights). The
    trainer loads it into DraftContext.warm_start and calls `initialize`."""
    initialize: Optional[Callable[[nn.Module, Any, DraftContext], None]] = None
    """(draft, cfg, ctx) -> None: fills a freshly built draft from ctx.warm_start before training; called once
    after `build` when `warm_start` names a draft, never when a trained draft is loaded."""
    bind_target: Optional[Callable[[nn.Module, nn.Module], None]] = None
    """(draft, frozen Hugging Face target) -> None: hands the draft the target parts it runs but does not own
    (Kangaroo: the shallow layers, final norm and LM head). Called by the trainer after the draft is built;
    those parts are never saved, exported or trained."""
    base_draft: Optional[Callable[[Any], str]] = None
    """cfg -> the export or run directory of the draft this add-on method extends (C2T's tree classifier, a judge).
    Every stage loads it into DraftContext.base; an export carries a copy of it (`draft/` inside)."""
    records: Optional[RecordStage] = None
    """For a method trained on records of its own instead of regenerated conversations and target features."""
    param_groups: Optional[Callable[[nn.Module], List[Dict[str, Any]]]] = None
    """Optimizer groups; default: every parameter that requires grad."""
    monitor: str = "tau_sim"
    """The validation metric (of the loss's) whose highest value picks the best/ snapshot."""
    graph_safe_loss: bool = False
    """Whether `loss` on a batch of fixed shapes reads nothing back to the host, keeps its shapes, gives only
    tensor metrics and depends on nothing but the batch and the draft's weights (no step count, no host state):
    train.cuda_graphs=auto may then capture its forward and backward in a CUDA graph and replay it."""
    reads_embeddings: bool = True
    """Whether the loss reads hidden_states[0] (the target's token embeddings): offline training then keeps
    the target's embedding table to recompute them from the token ids."""
    train_flops: Optional[Callable[[Any, TargetInfo, int], Dict[str, float]]] = None
    """(cfg, target, tokens a sequence) -> the draft's training FLOPs a sequence token, by part: its forward and
    backward, and what it reads of the target's LM head (the teacher rows, forward only), not the target's layers.
    The training suite's efficiency figures divide by it; None: the method's training is not counted."""

    def __post_init__(self):
        if self.from_export is None:
            object.__setattr__(self, "from_export", partial(read_export, self))


def read_export(spec: MethodSpec, config: Dict[str, Any], tensors: Dict[str, torch.Tensor],
                ctx: DraftContext) -> Tuple[Any, nn.Module]:
    """The default `from_export`: cfg = spec.config(**config.json's specdraft.method_config) (or
    spec.export_config(config) where none was saved), the draft built by spec.build and every tensor loaded
    strictly (after spec.export_tensors)."""
    saved = (config.get("specdraft") or {}).get("method_config")
    if saved and all(name in saved for name in spec.export_requires):
        cfg = spec.config(**saved)
    elif not saved and spec.export_config is not None:
        cfg = spec.export_config(config)
    else:
        raise SpecdraftError(f"this export has no {spec.name} method_config in config.json['specdraft']; export "
                             f"it with specdraft export --format hf")
    draft = spec.build(cfg, ctx)
    draft.load_state_dict(tensors if spec.export_tensors is None else spec.export_tensors(tensors, draft),
                          strict=True)
    return cfg, draft
