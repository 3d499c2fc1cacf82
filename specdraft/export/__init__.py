"""`specdraft export RUN_DIR --format FMT --out DIR`: checkpoints that serving engines load.

Formats come from the method's spec (`hf`: SGLang's layout; `speculators`: vLLM's). Every export writes
config.json + model.safetensors + the recipe, checks that each required weight is present, and appears in
one rename: a failed export leaves nothing behind, a killed one is finished or undone by the next
(`specdraft.core.io.atomic_dir`). An add-on method's export (a tree classifier, a judge) keeps a copy of the draft it
extends in `draft/`, so that one directory serves.

`--out` must be a new or empty directory or an earlier export (its config.json names its method): anything else is
refused in one line, a directory of other files replaced only with `--force`, and never the run (or export) being
read, a directory inside it or one that holds it.
Its files are readable as any other file the user writes (0644 under umask 022), and its
`specdraft.target_hub_id` names the target as a hub serves it (`--verifier`, else `specdraft.targets.provenance`),
which the speculators layout gives vLLM.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.core.io import atomic_dir, check_output_dir
from specdraft.core.tensor_files import save_tensors
from specdraft.drafts import BASE_DIR, EXPORT_FILE, RECIPE_FILE, export_section, is_export, load_draft
from specdraft.recipes import load_recipe, save_recipe
from specdraft.targets.provenance import target_hub_id


def check_export_out(sources, out: Path, force: bool = False) -> None:
    """`out` may be written: not one of the `sources` read (the run or export, an add-on's base), nor inside one,
    nor holding one, whatever `force` says; a new or empty directory or an export, or with `force` another
    directory."""
    resolved = out.expanduser().resolve()
    for source in sources:
        source = Path(source).expanduser().resolve()
        if resolved == source or source.is_relative_to(resolved) or resolved.is_relative_to(source):
            relation = "is" if resolved == source else "holds" if source.is_relative_to(resolved) else "is inside"
            raise SpecdraftError(f"--out {out} {relation} {source}, which this export reads; refusing to write "
                                 f"there (--force never replaces what is read): choose a directory outside it")
    check_output_dir(out, holds_export, "an export", force=force)


def holds_export(path: Path) -> bool:
    """An export's marker: a config.json whose `specdraft` section names a method (what `specdraft export`
    writes)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("specdraft"), dict) and "method" in config["specdraft"]


def export_draft(run_dir: str | Path, fmt: str, out: str | Path, dtype: str = "bfloat16",
                 trust_remote_code: bool = False, force: bool = False, verifier: str | None = None) -> Path:
    """A training run (or an export, exported again) -> `out` in format `fmt`, with its recipe.
    `trust_remote_code`: the command line's consent to run the target's code, to read its geometry. `force`: `out`
    may be a directory of other files, replaced (never the run read, see `check_export_out`). `verifier`: the
    target's hub id (default: `target_hub_id` of its path, None where that names none)."""
    run_dir, out = Path(run_dir), Path(out)
    loaded = load_draft(run_dir, trust_remote_code=trust_remote_code)
    check_export_out([run_dir, *([loaded.base.source] if loaded.base is not None else [])], out, force)
    recipe = load_recipe(run_dir / RECIPE_FILE, trust_remote_code=trust_remote_code)
    if fmt not in loaded.spec.exports:
        raise choices_error("export format", fmt, sorted(loaded.spec.exports))
    export = loaded.spec.exports[fmt]
    section = export_section(recipe.target, recipe.runtime, loaded.target, loaded.spec.name, loaded.method_cfg,
                             str(loaded.source), with_base=loaded.base is not None)
    section["target_hub_id"] = verifier or target_hub_id(recipe.target.path)
    config, tensors = export.write(loaded.draft, loaded.method_cfg, loaded.target, section)
    missing = [k for k in export.required_keys(loaded.draft, loaded.target) if k not in tensors]
    if missing:
        raise SpecdraftError(f"export format {fmt!r} is missing required weights: {', '.join(missing)}")
    weights_dtype = getattr(torch, dtype)
    tensors = {k: (v.to(weights_dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    config["torch_dtype"] = dtype
    config["specdraft"] = {**config.get("specdraft", {}), **section}
    with atomic_dir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_tensors(tensors, tmp / EXPORT_FILE, metadata={"format": "pt"})
        save_recipe(recipe, tmp)
        if loaded.base is not None:
            _copy_base(Path(loaded.base.source), tmp / BASE_DIR, dtype)
    return Path(out)


def _copy_base(source: Path, destination: Path, dtype: str) -> None:
    """An add-on's base draft inside its export: the base's own export copied, or its run exported (hf)."""
    if is_export(source):
        shutil.copytree(source, destination)
    else:
        export_draft(source, "hf", destination, dtype)
