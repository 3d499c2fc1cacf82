"""Build a runtime from a trained draft (a run directory or an export) and its target."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from specdraft.drafts import LoadedDraft, load_draft
from specdraft.core.errors import SpecdraftError
from specdraft.runtime.dynamic_exit import ExitChoice
from specdraft.runtime.engine import SpecEngine
from specdraft.runtime.target import TargetModel, from_hf, hf_rope_tables
from specdraft.runtime.tree import TreeShape
from specdraft.targets import load_target
from specdraft.targets.load import LoadedTarget, eos_token_ids

KNOWN_EXPORTS = ("hf (config.json with a `specdraft` section)", "speculators", "a training run directory")


@dataclass
class Runtime:
    engine: SpecEngine
    target: LoadedTarget  # the Hugging Face model and tokenizer (the `generate` baseline)
    draft: LoadedDraft
    eos_ids: List[int]

    def encode_chat(self, text: str) -> List[int]:
        tokenizer = self.target.tokenizer
        if tokenizer.chat_template:
            encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                    add_generation_prompt=True, return_dict=True)
            return list(encoded["input_ids"])
        return tokenizer(text)["input_ids"]


def _check_export(path: Path) -> None:
    config_file = path / "config.json"
    if not config_file.is_file():
        return  # a training run: load_draft explains what it looks for
    config = json.loads(config_file.read_text())
    if "specdraft" not in config:
        raise SpecdraftError(f"{path} is not an export specdraft can run (config.json has no `specdraft` "
                             f"section); valid: {', '.join(KNOWN_EXPORTS)}")


GEOMETRY = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")  # what a draft fits


def _check_geometry(loaded: LoadedDraft, target: LoadedTarget) -> None:
    trained, given = loaded.target, target.info
    for field_name in GEOMETRY:
        if getattr(trained, field_name) != getattr(given, field_name):
            raise SpecdraftError(f"the draft was trained for a target with {field_name}={getattr(trained, field_name)}"
                                 f" ({trained.name_or_path}); {given.name_or_path} has "
                                 f"{field_name}={getattr(given, field_name)}")


def resolve_device(device: str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)


@dataclass(frozen=True)
class ChainOptions:
    """Engine options beyond the tree shape (engine.py, chain.py, dynamic_exit.py): the chain-only ones, which a
    tree shape refuses, `reuse_shallow_tree`, which only a tree shape takes, and `overlap`, which every loop
    takes."""
    exit_threshold: Optional[float] = None
    """η: stop drafting once the draft's top-1 probability falls below it; None: the drafter's own
    `exit_threshold` (Kangaroo's trained η) for chains, else off."""
    dynamic_exit: bool = False
    """DEL's draft length per context from acceptance statistics."""
    reuse_shallow: bool = True
    """Verify from the drafter's `verify_start_layer` (Kangaroo: ℓ) over the states it computed while drafting."""
    more_exits: Tuple[str, ...] = ()
    """Further drafts of the same target at other exit layers (Kangaroo exports): the dynamic exit picks one per
    cycle (dynamic_exit.ExitChoice)."""
    reuse_shallow_tree: bool = False
    """Trees: the drafter runs every candidate through its shallow layers and the verify starts above them. Off
    by default: at depth 6, top-8, 48 nodes it runs more shallow rows (329) than it saves (294), and on an H100
    it ran at 0.72x plain decoding against 0.88x with the full verify (docs/benchmarks.md, Session 8)."""
    overlap: bool = True
    """Every shape, and plain decoding: one step in flight while the host reads the one before (engine.py)."""


def _engine_options(drafter, shape: TreeShape, options: ChainOptions) -> dict:
    if shape.topk != 1:
        if (options.exit_threshold or 0) > 0 or options.dynamic_exit or options.more_exits:
            raise SpecdraftError("--exit-threshold, --dynamic-exit and --more-exits apply to chains: add --chain")
        return {"reuse_shallow_tree": options.reuse_shallow_tree,  # the engine says when it cannot
                "overlap": options.overlap}
    eta = options.exit_threshold
    eta = drafter.caps.exit_threshold if eta is None else eta
    return {"exit_threshold": eta, "dynamic_exit": options.dynamic_exit, "reuse_shallow": options.reuse_shallow,
            "reuse_shallow_tree": options.reuse_shallow_tree, "overlap": options.overlap}


def _drafter(loaded: LoadedDraft, target: LoadedTarget, target_model: TargetModel):
    draft = loaded.draft.to(device=target_model.lm_head_weight.device, dtype=target.model.dtype)
    return loaded.spec.runtime(draft, loaded.method_cfg, target_model)


def _exit_choice(drafter, chain: ChainOptions, target: LoadedTarget, target_model: TargetModel) -> ExitChoice:
    """The first draft and those of `chain.more_exits`, which must run the target's shallow layers."""
    if not chain.dynamic_exit:
        raise SpecdraftError("--more-exits needs --dynamic-exit (it chooses the exit per cycle)")
    drafters = [drafter]
    for path in chain.more_exits:
        loaded = load_draft(Path(path))
        _check_geometry(loaded, target)
        drafters.append(_drafter(loaded, target, target_model))
    return ExitChoice(drafters)


def load_parts(path: str | Path, target_path: Optional[str] = None, device: str = "auto",
               dtype: str = "auto") -> Tuple[LoadedDraft, LoadedTarget]:
    """A run directory or export -> (the draft, the target it was trained for or `target_path`), checked to fit."""
    path = Path(path)
    _check_export(path)
    loaded = load_draft(path, target_path=target_path)
    if loaded.spec.runtime is None:
        raise SpecdraftError(f"method {loaded.spec.name!r} has no runtime drafter")
    target_cfg = replace(loaded.recipe.target, path=target_path) if target_path else loaded.recipe.target
    target = load_target(target_cfg, device=resolve_device(device), dtype=dtype, require_chat_template=False)
    _check_geometry(loaded, target)
    return loaded, target


def build_runtime(loaded: LoadedDraft, target: LoadedTarget, shape: TreeShape = TreeShape(), max_len: int = 2048,
                  use_graphs: Optional[bool] = None, chain: ChainOptions = ChainOptions()) -> Runtime:
    """A ready SpecEngine over loaded parts. It copies the target's weights, so one loaded target serves several
    runtimes (one per tree shape, say) without loading it again."""
    max_len = min(max_len, target.info.max_position_embeddings)
    target_model: TargetModel = from_hf(target.model, target.info)
    drafter = _drafter(loaded, target, target_model)
    if chain.more_exits:
        drafter = _exit_choice(drafter, chain, target, target_model)
    engine = SpecEngine(target_model, drafter, shape, max_len, hf_rope_tables(target.model, max_len), use_graphs,
                        **_engine_options(drafter, shape, chain))
    return Runtime(engine=engine, target=target, draft=loaded, eos_ids=eos_token_ids(target.model, target.tokenizer))


def load_runtime(path: str | Path, target_path: Optional[str] = None, device: str = "auto", dtype: str = "auto",
                 shape: TreeShape = TreeShape(), max_len: int = 2048,
                 use_graphs: Optional[bool] = None, chain: ChainOptions = ChainOptions()) -> Runtime:
    """A run directory or export -> a ready SpecEngine over the target it was trained for (or `target_path`)."""
    return build_runtime(*load_parts(path, target_path, device, dtype), shape, max_len, use_graphs, chain)
