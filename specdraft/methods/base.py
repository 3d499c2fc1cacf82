"""What every method gives the generic trainer, exporter, evaluator and runtime: a `MethodSpec` of plain
functions.

The Lightning module, the CLI, the exporter, the evaluator, the runtime and the data stage only call these hooks;
none of them branches on a method's name. A new method that needs something else from them adds a hook here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from specdraft.core.drafting import Drafter
from specdraft.core.types import DraftBatch, DraftContext, LossOutput, TargetInfo


@dataclass(frozen=True)
class ExportFormat:
    """One on-disk layout a serving engine loads: `write(draft, cfg, target, target_ref)` -> (config, tensors)."""

    write: Callable[..., Tuple[Dict[str, Any], Dict[str, torch.Tensor]]]
    required_keys: Callable[[Any, TargetInfo], List[str]]
    """Weight names that must be present; the exporter fails loudly if one is missing."""


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
    from_export: Callable[[Dict[str, Any], Dict[str, torch.Tensor], TargetInfo], Tuple[Any, nn.Module]]
    """(config.json, tensors, target) of an `hf` export -> (cfg, draft) ready for evaluation."""
    runtime: Callable[[nn.Module, Any, Any], Drafter]
    """(draft, cfg, runtime target model) -> the runtime's drafter (specdraft.core.drafting). The evaluator and
    the runtime both draft through it: a method writes its inference once."""
    warm_start: Optional[Callable[[Any], Optional[str]]] = None
    """cfg -> the run directory or export whose trained draft starts this one (None: random weights). The
    trainer loads it into DraftContext.warm_start and calls `initialize`."""
    initialize: Optional[Callable[[nn.Module, Any, DraftContext], None]] = None
    """(draft, cfg, ctx) -> None: fills a freshly built draft from ctx.warm_start before training; called once
    after `build` when `warm_start` names a draft, never when a trained draft is loaded."""
    bind_target: Optional[Callable[[nn.Module, nn.Module], None]] = None
    """(draft, frozen Hugging Face target) -> None: hands the draft the target parts it runs but does not own
    (Kangaroo: the shallow layers, final norm and LM head). Called by the trainer and the evaluator after the
    draft is built or loaded; those parts are never saved, exported or trained."""
    param_groups: Optional[Callable[[nn.Module], List[Dict[str, Any]]]] = None
    """Optimizer groups; default: every parameter that requires grad."""
    reads_embeddings: bool = True
    """Whether the loss reads hidden_states[0] (the target's token embeddings): offline training then keeps
    the target's embedding table to recompute them from the token ids."""
