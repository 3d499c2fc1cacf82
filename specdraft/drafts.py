"""Find and load a trained draft: from an export (config.json + model.safetensors) or a training run directory
(best/ or last/ snapshot + recipe.yaml).

An export is read from its config.json alone: its `specdraft` section names the method, the method's config, the
target it was trained for (where it was, and its geometry) and the draft's runtime settings, so a serving
machine loads it without the trainer's dependencies (no OmegaConf). A run directory is read through its recipe.
"""
from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specdraft.config import RuntimeConfig, TargetConfig
from specdraft.core.errors import SpecdraftError, error_summary
from specdraft.core.io import reading, recover
from specdraft.core.types import BaseDraft, DraftContext, TargetInfo, geometry_mismatch
from specdraft.methods import get_method
from specdraft.methods.base import MethodSpec
from specdraft.targets import load_target_info
from specdraft.targets.remote_code import with_remote_code

SNAPSHOT_FILE = "draft.safetensors"
EXPORT_FILE = "model.safetensors"
RECIPE_FILE = "recipe.yaml"


@dataclass
class LoadedDraft:
    spec: MethodSpec
    method_cfg: Any
    draft: torch.nn.Module
    target: TargetInfo
    """The geometry of the target the draft was trained for."""
    target_config: TargetConfig
    """Where that target is (path, revision, dtype); never trusts remote code (a file cannot turn that on)."""
    runtime: RuntimeConfig
    """The draft's runtime settings: the export's, or its run's recipe's `runtime` section."""
    source: Path
    base: Optional[BaseDraft] = None
    """The draft an add-on method extends (MethodSpec.base_draft), loaded with it."""


def read_safetensors(path: Path) -> Dict[str, torch.Tensor]:
    if not path.is_file():
        raise SpecdraftError(f"weights file not found: {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise SpecdraftError(f"corrupt safetensors file {path}: {err}") from None


def is_export(path: Path) -> bool:
    """An export has a config.json (a run directory has none); `read_export_config` checks it is ours."""
    return (path / "config.json").is_file()


def read_export_config(path: Path) -> Dict[str, Any]:
    """An export's config.json, checked to carry the `specdraft` section this loader reads."""
    config_file = path / "config.json"
    with reading(config_file, "export config", "export the run again (specdraft export RUN_DIR --out DIR)"):
        config = json.loads(config_file.read_text())
    if not isinstance(config, dict) or not isinstance(config.get("specdraft"), dict) \
            or "method" not in config["specdraft"]:
        raise SpecdraftError(f"{path} is not an export specdraft can run (config.json has no `specdraft` section "
                             f"naming its method); export it with `specdraft export RUN_DIR --format hf`")
    return config


BASE_DIR = "draft"
"""Where an add-on method's export keeps a copy of the draft it extends."""


def export_section(recipe_target: TargetConfig, runtime: RuntimeConfig, target: TargetInfo, method: str,
                   method_cfg: Any, source: str, with_base: bool = False) -> Dict[str, Any]:
    """The `specdraft` section an export's config.json carries (what `load_draft` reads back)."""
    target_config = {k: v for k, v in asdict(recipe_target).items() if k != "trust_remote_code"}
    section = {"method": method, "method_config": asdict(method_cfg), "target": recipe_target.path,
               "target_revision": recipe_target.revision, "target_config": target_config,
               "target_info": target.to_dict(), "runtime": asdict(runtime), "source": source}
    return {**section, "base": BASE_DIR} if with_base else section


def _fits(value, hint) -> bool:
    """Whether a value read from JSON has the type a dataclass field declares (int, float, str, bool, Optional,
    List, Dict, Any): a file's `"topk": "many"` never reaches the code that counts with it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Union:
        return any(_fits(value, arg) for arg in args)
    if origin in (list, List):
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value) if args else \
            isinstance(value, list)
    if origin in (dict, Dict):
        return isinstance(value, dict)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _dataclass_from(cls, values: Optional[Dict[str, Any]], what: str):
    """cls(**values) for the fields cls has, each value of its field's type; a bad value is one line naming
    `what` and the field (never the value: a file's contents stay out of messages). None is a value the file
    does not record (an export that names no target: its geometry says what it was trained for)."""
    if values is not None and not isinstance(values, dict):
        raise SpecdraftError(f"bad {what}: a {type(values).__name__}, expected a mapping of settings")
    hints = typing.get_type_hints(cls)
    known = {f.name: hints[f.name] for f in fields(cls)}
    values = {k: v for k, v in (values or {}).items() if k in known}
    for name, value in values.items():
        if value is not None and not _fits(value, known[name]):
            expected = known[name].__name__ if isinstance(known[name], type) else \
                str(known[name]).replace("typing.", "")
            raise SpecdraftError(f"bad {what}: {name} is of type {type(value).__name__}, expected {expected}")
    try:
        return cls(**values)
    except (TypeError, ValueError, SpecdraftError) as err:
        raise SpecdraftError(f"bad {what}: {err}") from None


def _export_parts(section: Dict[str, Any], config_file: Path, trust_remote_code: bool = False
                  ) -> Tuple[TargetConfig, RuntimeConfig]:
    """The target's place and the runtime settings an export's section records (older exports: path only). The
    target trusts remote code by the command line's consent alone, never by the file (targets/remote_code.py)."""
    target_values = section.get("target_config") or {"path": section.get("target"),
                                                     "revision": section.get("target_revision")}
    target_cfg = _dataclass_from(TargetConfig, target_values, f"target_config in {config_file}")
    target_cfg = with_remote_code(target_cfg, trust_remote_code, f"export config {config_file}")
    return target_cfg, _dataclass_from(RuntimeConfig, section.get("runtime"), f"runtime in {config_file}")


def _trained_for(recorded: Optional[Dict[str, Any]], trained: TargetConfig, runs_with: Optional[str]) -> TargetInfo:
    """The geometry of the target the draft was trained for: what the export recorded; else read from where the
    target was; else, where that target is not on this machine, from `runs_with`, whose fit the draft's weights
    then check as they load. `trained.trust_remote_code` holds the command line's consent (for either)."""
    if recorded:
        return TargetInfo.from_dict(recorded)
    try:
        return load_target_info(trained)
    except SpecdraftError:
        if runs_with is None:
            raise
        return load_target_info(TargetConfig(path=runs_with, trust_remote_code=trained.trust_remote_code))


def as_base(loaded: LoadedDraft) -> BaseDraft:
    """A loaded draft as another method's base: its runtime drafter made on the target it will run with."""
    spec, draft, cfg = loaded.spec, loaded.draft, loaded.method_cfg

    def runtime(target_model):
        return spec.runtime(draft.to(device=target_model.device, dtype=target_model.dtype), cfg, target_model)

    source = loaded.source.parent if loaded.source.name == EXPORT_FILE else loaded.source.parents[1]
    return BaseDraft(method=spec.name, draft=draft, method_cfg=cfg,
                     feature_layers=tuple(spec.feature_layers(cfg, loaded.target)), runtime=runtime, source=str(source),
                     base=loaded.base)


def load_base(spec: MethodSpec, method_cfg: Any, target: TargetInfo) -> Optional[BaseDraft]:
    """The draft an add-on method's `base_draft` hook names, loaded; None for a method that extends none."""
    if spec.base_draft is None:
        return None
    return as_base(load_draft(spec.base_draft(method_cfg), target=target))


def load_guide(spec: MethodSpec, method_cfg: Any, target: TargetInfo) -> Optional[BaseDraft]:
    """The trained draft of this method that its record stage's `guide` hook names, loaded; None where it names
    none. One that is missing, of another method or made for another target is a one-line error naming the key."""
    named = spec.records.guide(method_cfg) if spec.records is not None and spec.records.guide is not None else None
    if named is None:
        return None
    key, path = named
    try:
        loaded = load_draft(path)
    except SpecdraftError as err:
        raise SpecdraftError(f"{key}={path}: {err}") from None
    if loaded.spec.name != spec.name:
        raise SpecdraftError(f"{key}={path} holds a {loaded.spec.name} draft, not a {spec.name}")
    mismatch = geometry_mismatch(loaded.target, target)
    if mismatch is not None:
        raise SpecdraftError(f"{key}={path} was made for another target: {mismatch}")
    return as_base(loaded)


def state_dict_mismatch(err: RuntimeError) -> str:
    """load_state_dict's error as one line naming the first tensor it reports (missing, unexpected or of another
    shape); its own first line names only the module."""
    details = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
    return details[0] if details else error_summary(err)


def _export_base(path: Path, section: Dict[str, Any], target: TargetInfo) -> Optional[BaseDraft]:
    """The draft an add-on's export keeps in BASE_DIR, loaded; None for an export of a draft that extends none."""
    if not section.get("base"):
        return None
    if section["base"] != BASE_DIR:
        raise SpecdraftError(f"{path / 'config.json'} names base {section['base']!r}; an export keeps the draft it "
                             f"extends in {BASE_DIR}/")
    return as_base(load_draft(path / BASE_DIR, target=target))


def _load_export(path: Path, target: Optional[TargetInfo], target_path: Optional[str],
                 trust_remote_code: bool) -> LoadedDraft:
    config = read_export_config(path)
    section, config_file = config["specdraft"], path / "config.json"
    try:
        spec = get_method(str(section["method"]))
    except SpecdraftError as err:
        raise SpecdraftError(f"{config_file}: {err}") from None
    target_cfg, runtime = _export_parts(section, config_file, trust_remote_code)
    with reading(config_file, "export config", "export the run again (specdraft export RUN_DIR --out DIR)"):
        target = target or _trained_for(section.get("target_info"), target_cfg, target_path)
    base = _export_base(path, section, target)
    source, tensors = path / EXPORT_FILE, read_safetensors(path / EXPORT_FILE)
    try:
        cfg, draft = spec.from_export(config, tensors, DraftContext(target=target, base=base))
    except RuntimeError as err:  # load_state_dict: missing, unexpected or misshapen weights
        raise SpecdraftError(f"{source} does not fit a draft for {target.name_or_path}: "
                             f"{state_dict_mismatch(err)}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # a config.json that is not what it claims
        raise SpecdraftError(f"corrupt export config {config_file}: {error_summary(err)}") from None
    target_cfg = replace(target_cfg, trust_remote_code=False)  # the caller applies its own consent
    return LoadedDraft(spec, cfg, draft.eval(), target, target_cfg, runtime, source, base)


def _snapshot_file(run_dir: Path) -> Path:
    for name in ("best", "last"):
        recover(run_dir / name)
        if (run_dir / name / SNAPSHOT_FILE).is_file():
            return run_dir / name / SNAPSHOT_FILE
    raise SpecdraftError(f"no trained draft in {run_dir} (looked for best/ and last/{SNAPSHOT_FILE})")


def _load_run(path: Path, overrides: List[str], target: Optional[TargetInfo], target_path: Optional[str],
              trust_remote_code: bool) -> LoadedDraft:
    from specdraft.recipes import load_recipe  # a run directory's recipe: the trainer's dependencies

    recipe = load_recipe(path / RECIPE_FILE, list(overrides), trust_remote_code)
    spec = get_method(recipe.method_name)
    target = target or _trained_for(None, recipe.target, target_path)
    source = _snapshot_file(path)
    base = load_base(spec, recipe.method, target)
    draft = spec.build(recipe.method, DraftContext(target=target, base=base))
    try:
        draft.load_state_dict(read_safetensors(source), strict=True)
    except RuntimeError as err:
        raise SpecdraftError(f"{source} does not fit this recipe's draft: {state_dict_mismatch(err)}") from None
    target_cfg = replace(recipe.target, trust_remote_code=False)  # a file never turns it on: the caller does
    return LoadedDraft(spec, recipe.method, draft.eval(), target, target_cfg, recipe.runtime, source, base)


def load_draft(path: str | Path, overrides: List[str] = (), target: Optional[TargetInfo] = None,
               target_path: Optional[str] = None, trust_remote_code: bool = False) -> LoadedDraft:
    """An export or a run directory -> the draft in eval mode, with the geometry of the target it was trained for
    (`target`, when the caller has it; `target_path`: the target it will run with, read only where the one it was
    trained for is not on this machine). `overrides` (key=value) apply to a run directory's recipe.
    `trust_remote_code`: the command line's consent to run the target's code where its geometry must be read
    from its own config (never taken from the draft's files)."""
    path = Path(path)
    recover(path)  # an export whose swap a kill interrupted: finished or undone first
    if not path.is_dir():
        raise SpecdraftError(f"{path} does not exist (expected an export or a training run directory)")
    if is_export(path):
        return _load_export(path, target, target_path, trust_remote_code)
    if not (path / RECIPE_FILE).is_file():
        raise SpecdraftError(f"{path} is neither an export (config.json, {EXPORT_FILE}) nor a training run "
                             f"({RECIPE_FILE})")
    return _load_run(path, overrides, target, target_path, trust_remote_code)


def runtime_settings(path: str | Path, trust_remote_code: bool = False) -> RuntimeConfig:
    """The runtime settings a draft carries (an export's config.json or a run's recipe), without loading it
    (`trust_remote_code`: the command's consent, which the recipe's warnings speak of)."""
    path = Path(path)
    if is_export(path):
        return _export_parts(read_export_config(path)["specdraft"], path / "config.json", trust_remote_code)[1]
    if (path / RECIPE_FILE).is_file():
        from specdraft.recipes import load_recipe

        return load_recipe(path / RECIPE_FILE, trust_remote_code=trust_remote_code).runtime
    return RuntimeConfig()


def warm_start_draft(spec: MethodSpec, method_cfg: Any, target: TargetInfo) -> Optional[torch.nn.Module]:
    """The trained draft the method's `warm_start` hook names (its init_from), loaded for its `initialize`; None
    when it names none."""
    path = spec.warm_start(method_cfg) if spec.warm_start is not None else None
    return load_draft(path, target=target).draft if path else None
