"""Add-on methods in tests (C2T's tree classifier, a judge: methods that extend a trained draft and train on
records of their own): which registered methods are drafts and which are add-ons, a tiny base draft to extend,
and an add-on's recipe."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from specdraft import cli
from specdraft.methods import METHODS
from tests.test_train_export_eval import make_recipe

DRAFT_METHODS = sorted(name for name, spec in METHODS.items() if spec.base_draft is None)
"""Methods that draft by themselves (the drafter, zero-init and contract tests' CASES cover them)."""
ADDON_METHODS = sorted(name for name, spec in METHODS.items() if spec.base_draft is not None)
"""Methods that extend a trained draft (the contract test's ADDON_CASES cover them)."""


def train_base_export(directory: Path, target_dir: Path, distilled: Path) -> Path:
    """A tiny EAGLE-3 draft of the tiny target, trained 4 steps and exported (hf): what an add-on extends."""
    directory.mkdir(parents=True, exist_ok=True)
    recipe = make_recipe(directory, target_dir, distilled, max_steps=4, val_every_steps=4)
    assert cli.main(["train", str(recipe)]) == 0
    assert cli.main(["export", str(directory / "run"), "--out", str(directory / "hf")]) == 0
    return directory / "hf"


def write_prompts(path: Path, records: Iterable[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def addon_recipe(tmp_path: Path, target_dir: Path, method: str, method_settings: dict, prompts: Path,
                 shard_size: int = 2) -> Path:
    """A recipe of the add-on `method` (its settings, the base draft among them) over `prompts`, its records,
    run and export under tmp_path."""
    method_yaml = ", ".join(f"{key}: {value}" for key, value in {"name": method, **method_settings}.items())
    recipe = tmp_path / f"{method}.yaml"
    recipe.write_text(f"""
target: {{path: {target_dir}}}
method: {{{method_yaml}}}
data: {{prompts: [{prompts}], val_fraction: 0.25}}
distill: {{output_dir: {tmp_path / 'records'}, shard_size: {shard_size}, max_new_tokens: 12}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 3, micro_batch_size: 2, val_every_steps: 3, lr: 0.01,
         warmup_steps: 1, log_every_steps: 1}}
""")
    return recipe


def judge_miner(target, base: Path, max_new_tokens: int, **settings):
    """A JudgeMiner of the loaded tiny `target` beside the exported `base` draft, its method settings as given,
    its context as the data stage makes it (the base draft and any method.mine_judge loaded) -> (miner, the
    progress callback's counts)."""
    from specdraft.config import DataConfig, DistillConfig
    from specdraft.drafts import load_base, load_guide
    from specdraft.methods.base import RecordContext
    from specdraft.methods.judge import JudgeConfig, JudgeMiner

    spec, cfg, done = METHODS["judge"], JudgeConfig(draft=str(base), **settings), []
    ctx = RecordContext(target=target, base=load_base(spec, cfg, target.info), device="cpu",
                        distill=DistillConfig(max_new_tokens=max_new_tokens), data=DataConfig(max_length=256),
                        progress=done.append, guide=load_guide(spec, cfg, target.info))
    return JudgeMiner(cfg, ctx), done


def mine_labels(tmp_path: Path, target, base: Path, records: Iterable[dict], max_new_tokens: int, **settings):
    """The judge's records of `records` (prompt records), every prompt checked to be counted once -> (miner, rows,
    problems)."""
    from specdraft.data.sources import load_conversations

    records = list(records)
    prompts = write_prompts(tmp_path / "prompts.jsonl", records)
    miner, done = judge_miner(target, base, max_new_tokens, **settings)
    rows, problems = miner.records(dict(enumerate(load_conversations([str(prompts)]))))
    assert len(rows) + len(problems) == sum(done) == len(records)  # every prompt counted once
    return miner, rows, problems
