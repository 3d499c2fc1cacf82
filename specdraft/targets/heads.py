"""What offline training keeps of the target: its LM head (the teacher is final_hidden @ lm_head.T, softcapped where
the family does: specdraft.targets.head_forms) and, for methods that read hidden_states[0], its embedding table.
Both are read straight from the checkpoint's safetensors files; no decoder layer is ever built (the model skeleton
that names them lives on the meta device). A checkpoint that does not name them as the model does (or is not
safetensors) falls back to loading the whole model on the CPU once and keeping the two matrices. A weight-only
quantized target (target.quantization=int8|int4) gives its quantized LM head, dequantized.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional

import torch
from safetensors import safe_open

from specdraft.config import TargetConfig
from specdraft.core.types import TargetInfo
from specdraft.layers.quantized import WEIGHT_ONLY, fake_quantized
from specdraft.targets.head_forms import logit_softcap
from specdraft.targets.load import MODEL_BUILD_LOCK, local_or_hub, resolve_dtype
from specdraft.targets.remote_code import target_error
from specdraft.targets.vision import model_class

log = logging.getLogger(__name__)


@dataclass
class TargetHeads:
    info: TargetInfo
    lm_head: torch.Tensor
    """[V, H] the target's output embedding."""
    embed_tokens: Optional[torch.Tensor]
    """[V, H] the target's input embedding table (None when the method does not read hidden_states[0])."""
    logit_softcap: Optional[float] = None
    """c of the target's final-logit softcap c * tanh(logits / c) (specdraft.targets.head_forms), None for none."""


def _tensor_names(config, cfg: TargetConfig) -> Dict[str, List[str]]:
    """{"lm_head": names, "embed": names}: every parameter name the model gives each matrix (tied: both)."""
    with MODEL_BUILD_LOCK, torch.device("meta"):
        model = model_class(config).from_config(config, trust_remote_code=cfg.trust_remote_code)
    wanted = {"lm_head": model.get_output_embeddings().weight, "embed": model.get_input_embeddings().weight}
    named = list(model.named_parameters(remove_duplicate=False))
    return {key: [name for name, param in named if param is weight] for key, weight in wanted.items()}


def _checkpoint_files(source: str, cfg: TargetConfig, names: List[str]) -> Dict[str, Path]:
    """{tensor name: safetensors file holding it} for the names the checkpoint has."""
    from transformers.utils import cached_file

    def fetch(filename: str) -> Optional[Path]:
        path = cached_file(source, filename, revision=cfg.revision, _raise_exceptions_for_missing_entries=False)
        return Path(path) if path else None

    index = fetch("model.safetensors.index.json")
    if index is not None:
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: fetch(weight_map[name]) for name in names if name in weight_map}
    single = fetch("model.safetensors")
    if single is None:
        return {}
    with safe_open(str(single), framework="pt") as handle:
        keys = set(handle.keys())
    return {name: single for name in names if name in keys}


def _read(files: Dict[str, Path], names: List[str]) -> Optional[torch.Tensor]:
    for name in names:
        if name in files:
            with safe_open(str(files[name]), framework="pt") as handle:
                return handle.get_tensor(name)
    return None


def _from_full_model(cfg: TargetConfig, embeddings: bool):
    from specdraft.targets.load import load_target

    log.info("target %s: LM head not found by name in safetensors; loading the whole model once on the CPU", cfg.path)
    model = load_target(replace(cfg, quantization="none"), "cpu", require_chat_template=False).model
    lm_head = model.get_output_embeddings().weight.detach().clone()
    embed = model.get_input_embeddings().weight.detach().clone() if embeddings else None
    return lm_head, embed


def load_target_heads(cfg: TargetConfig, embeddings: bool, device: torch.device | str = "cpu") -> TargetHeads:
    """The target's LM head and (with `embeddings`) embedding table, in `target.dtype` resolved for `device`."""
    from transformers import AutoConfig

    source = local_or_hub(cfg)
    try:
        config = AutoConfig.from_pretrained(source, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise target_error(cfg, "read the config of", err) from None
    names = _tensor_names(config, cfg)
    files = _checkpoint_files(source, cfg, names["lm_head"] + names["embed"])
    lm_head, embed = _read(files, names["lm_head"]), _read(files, names["embed"]) if embeddings else None
    if lm_head is None or (embeddings and embed is None):
        lm_head, embed = _from_full_model(cfg, embeddings)
    dtype = resolve_dtype(cfg.dtype, device)
    tied = set(names["lm_head"]) & set(names["embed"])
    embed = None if embed is None else embed.to(device, dtype)
    lm_head = embed if tied and embed is not None else lm_head.to(device, dtype)
    if cfg.quantization in WEIGHT_ONLY:  # the quantized target's head (its embedding stays as it is)
        lm_head = fake_quantized(lm_head, cfg.quantization)
    return TargetHeads(info=TargetInfo.from_hf_config(config, cfg.path), lm_head=lm_head, embed_tokens=embed,
                       logit_softcap=logit_softcap(config))
