"""Find and load a trained draft: from a run directory (best/ or last/ snapshot) or from an `hf` export."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specdraft.config import Recipe, TargetConfig
from specdraft.recipes import load_recipe
from specdraft.core.errors import SpecdraftError
from specdraft.methods import get_method
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.methods.base import MethodSpec
from specdraft.targets import load_target_info

SNAPSHOT_FILE = "draft.safetensors"
EXPORT_FILE = "model.safetensors"


@dataclass
class LoadedDraft:
    recipe: Recipe
    spec: MethodSpec
    method_cfg: Any
    draft: torch.nn.Module
    target: TargetInfo
    source: Path


def read_safetensors(path: Path) -> Dict[str, torch.Tensor]:
    if not path.is_file():
        raise SpecdraftError(f"weights file not found: {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise SpecdraftError(f"corrupt safetensors file {path}: {err}") from None


def _snapshot_file(run_dir: Path) -> Path:
    for name in ("best", "last"):
        if (run_dir / name / SNAPSHOT_FILE).is_file():
            return run_dir / name / SNAPSHOT_FILE
    raise SpecdraftError(f"no trained draft in {run_dir} (looked for best/ and last/{SNAPSHOT_FILE})")


def _export_config(path: Path) -> Optional[Dict[str, Any]]:
    """An export's config.json, or None for a run directory."""
    if (path / "config.json").is_file() and (path / EXPORT_FILE).is_file():
        return json.loads((path / "config.json").read_text())
    return None


def _trained_for(config: Optional[Dict[str, Any]], trained: TargetConfig,
                 runs_with: Optional[TargetConfig]) -> TargetInfo:
    """The geometry of the target the draft was trained for: what the export recorded; else read from the
    recipe's target; else, where that target is not on this machine (an export from another one), from the
    target it will run with, `runs_with`, whose fit the draft's weights then check as they load."""
    recorded = ((config or {}).get("specdraft") or {}).get("target_info")
    if recorded:
        return TargetInfo.from_dict(recorded)
    try:
        return load_target_info(trained)
    except SpecdraftError:
        if runs_with is None:
            raise
        return load_target_info(runs_with)


def load_draft(path: str | Path, overrides: List[str] = (), target: Optional[TargetInfo] = None,
               target_path: Optional[str] = None) -> LoadedDraft:
    """A run directory or an `hf` export directory -> the draft in eval mode, with its recipe and the geometry of
    the target it was trained for (`target`, when the caller has it; `target_path`: the target it will run with,
    read only where the one it was trained for is not on this machine)."""
    path = Path(path)
    if not (path / "recipe.yaml").is_file():
        raise SpecdraftError(f"{path} is neither a training run nor an export (no recipe.yaml)")
    recipe = load_recipe(path / "recipe.yaml", list(overrides))
    spec = get_method(recipe.method_name)
    config = _export_config(path)
    runs_with = replace(recipe.target, path=target_path) if target_path else None
    target = target or _trained_for(config, recipe.target, runs_with)
    if config is not None:
        source = path / EXPORT_FILE
        try:
            cfg, draft = spec.from_export(config, read_safetensors(source), target)
        except RuntimeError as err:  # load_state_dict: missing, unexpected or misshapen weights
            raise SpecdraftError(f"{source} does not fit a draft for {target.name_or_path}: "
                                 f"{str(err).splitlines()[0]}") from None
    else:
        source = _snapshot_file(path)
        cfg, draft = recipe.method, spec.build(recipe.method, DraftContext(target=target))
        state = read_safetensors(source)
        try:
            draft.load_state_dict(state, strict=True)
        except RuntimeError as err:
            raise SpecdraftError(f"{source} does not fit this recipe's draft: {str(err).splitlines()[0]}") from None
    return LoadedDraft(recipe=recipe, spec=spec, method_cfg=cfg, draft=draft.eval(), target=target, source=source)


def warm_start_draft(spec: MethodSpec, method_cfg: Any, target: TargetInfo) -> Optional[torch.nn.Module]:
    """The trained draft the method's `warm_start` hook names (its init_from), loaded for its `initialize`; None
    when it names none."""
    path = spec.warm_start(method_cfg) if spec.warm_start is not None else None
    return load_draft(path, target=target).draft if path else None
