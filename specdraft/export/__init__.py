"""`specdraft export RUN_DIR --format FMT --out DIR`: checkpoints that serving engines load.

Formats come from the method's spec (`hf`: SGLang's layout; `speculators`: vLLM's). Every export writes
config.json + model.safetensors + the recipe, checks that each required weight is present, and appears in
one rename: a failed export leaves nothing behind.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdraft.recipes import save_recipe
from specdraft.drafts import EXPORT_FILE, load_draft
from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.core.io import atomic_dir
from specdraft.targets import target_provenance


def export_draft(run_dir: str | Path, fmt: str, out: str | Path, dtype: str = "bfloat16") -> Path:
    loaded = load_draft(run_dir)
    if fmt not in loaded.spec.exports:
        raise choices_error("export format", fmt, sorted(loaded.spec.exports))
    export = loaded.spec.exports[fmt]
    provenance = {**target_provenance(loaded.recipe.target), "target_info": loaded.target.to_dict(),
                  "source": str(loaded.source)}
    config, tensors = export.write(loaded.draft, loaded.method_cfg, loaded.target, provenance)
    missing = [k for k in export.required_keys(loaded.draft, loaded.target) if k not in tensors]
    if missing:
        raise SpecdraftError(f"export format {fmt!r} is missing required weights: {', '.join(missing)}")
    weights_dtype = getattr(torch, dtype)
    tensors = {k: (v.to(weights_dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    config["torch_dtype"] = dtype
    with atomic_dir(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / EXPORT_FILE), metadata={"format": "pt"})
        save_recipe(loaded.recipe, tmp)
    return Path(out)
