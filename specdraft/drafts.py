"""Find and load a trained draft: from a run directory (best/ or last/ snapshot) or from an `hf` export."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specdraft.config import Recipe, load_recipe
from specdraft.errors import SpecdraftError
from specdraft.methods import get_method
from specdraft.methods.base import DraftContext, MethodSpec, TargetInfo
from specdraft.target import load_target_info

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


def load_draft(path: str | Path, overrides: List[str] = (), target: Optional[TargetInfo] = None) -> LoadedDraft:
    """A run directory or an `hf` export directory -> the draft in eval mode, with its recipe and target."""
    path = Path(path)
    if not (path / "recipe.yaml").is_file():
        raise SpecdraftError(f"{path} is neither a training run nor an export (no recipe.yaml)")
    recipe = load_recipe(path / "recipe.yaml", list(overrides))
    spec = get_method(recipe.method_name)
    target = target or load_target_info(recipe.target)
    if (path / "config.json").is_file() and (path / EXPORT_FILE).is_file():
        config = json.loads((path / "config.json").read_text())
        cfg, draft = spec.from_export(config, read_safetensors(path / EXPORT_FILE), target)
        source = path / EXPORT_FILE
    else:
        source = _snapshot_file(path)
        cfg, draft = recipe.method, spec.build(recipe.method, DraftContext(target=target))
        state = read_safetensors(source)
        try:
            draft.load_state_dict(state, strict=True)
        except RuntimeError as err:
            raise SpecdraftError(f"{source} does not fit this recipe's draft: {str(err).splitlines()[0]}") from None
    return LoadedDraft(recipe=recipe, spec=spec, method_cfg=cfg, draft=draft.eval(), target=target, source=source)
