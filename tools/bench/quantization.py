"""Quantization suite: what an 8/4-bit frozen target (target.quantization, bitsandbytes) costs in simulated τ, on
existing distilled data.

For each setting (none, 8bit, 4bit) it trains the recipe's draft from scratch with the same data, split, seed and
steps (online features from the target at that setting), then measures held-out simulated τ twice: as the trainer
logs it (val/tau_sim: the teacher is the target at that setting) and against the unquantized target (the one a
server runs the draft beside). Each setting runs in its own process, so peak GPU memory is its own. Prints a table
of every setting measured in WORK so far (this call's and earlier calls', so that settings can run in separate
calls) and writes WORK/quantization.json.

    python tools/bench/quantization.py RECIPE --work WORK [--settings none,8bit,4bit] [--steps 400]
        [--micro-batch 16] [key=value ...]

On the GPU, with SmolLM2 and distilled data already at $HOME/work/data (the acceptance suite's WORK/data), about
2-3 minutes a setting on an H200 (add --settings none, then 8bit, then 4bit to keep each call short):
    python tools/bench/quantization.py recipes/eagle3_smollm2.yaml --work $HOME/work/quant \\
        target.path=$HOME/smol/SmolLM2-135M-Instruct.Q4_1.gguf distill.output_dir=$HOME/work/data \\
        data.max_length=1024 data.val_fraction=0.02
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from suite import child_env, finish, machine, markdown_table, write_report

import torch

SETTINGS = ("none", "8bit", "4bit")


def _gib(num_bytes: float) -> float:
    return num_bytes / 2 ** 30


def target_memory_gib(recipe) -> float:
    """GPU memory the frozen target's weights take at recipe.target.quantization (0 on the CPU)."""
    from specdraft.targets import load_target

    if not torch.cuda.is_available():
        return 0.0
    before = torch.cuda.memory_allocated()
    target = load_target(recipe.target, "cuda", quantize=True)
    if recipe.target.quantization == "none":
        target.model.to(torch.bfloat16)  # as training holds it
    used = torch.cuda.memory_allocated() - before
    del target
    torch.cuda.empty_cache()
    return _gib(used)


def tau_against_unquantized(recipe, run_dir: Path) -> dict:
    """Validation metrics of run_dir/last's draft with the unquantized target as the teacher (same split)."""
    import dataclasses

    import lightning as L
    from safetensors.torch import load_file

    from specdraft.methods import get_method
    from specdraft.core.types import DraftContext
    from specdraft.targets import load_target
    from specdraft.train.data import DistilledData, answer_token_counts, load_distilled, split_distilled
    from specdraft.train.module import DraftModule
    from specdraft.train.trainer import _precision

    recipe = dataclasses.replace(recipe, target=dataclasses.replace(recipe.target, quantization="none"))
    distill_dirs = [recipe.distill.output_dir, *recipe.train.extra_distilled]
    dataset = load_distilled(distill_dirs)
    train_idx, val_idx = split_distilled(distill_dirs, len(dataset), recipe.data.val_fraction, recipe.train.seed)
    target = load_target(recipe.target, "cpu")
    ctx = DraftContext(target=target.info, token_counts=answer_token_counts(dataset, train_idx, target.info.vocab_size))
    module = DraftModule(get_method(recipe.method_name), recipe.method, recipe.train, ctx, target.model)
    module.configure_model()
    module.draft.load_state_dict(load_file(run_dir / "last" / "draft.safetensors"))
    module.features.setup(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    trainer = L.Trainer(accelerator="auto", devices=1, precision=_precision(recipe.train), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(module, datamodule=DistilledData(dataset, recipe.data, recipe.train, train_idx, val_idx),
                               verbose=False)[0]
    return {name: float(value) for name, value in metrics.items()}


def run_setting(recipe_path: str, setting: str, work: Path, steps: int, micro_batch: int, overrides: list) -> dict:
    """Train one setting from scratch and measure it (runs inside the child process)."""
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    run_dir = work / setting
    recipe = load_recipe(recipe_path, [*overrides, f"target.quantization={setting}", "data.features=online",
                                       f"train.output_dir={run_dir}", f"train.max_steps={steps}",
                                       f"train.micro_batch_size={micro_batch}", f"train.val_every_steps={steps}",
                                       "train.resume=null"])
    target_gib = target_memory_gib(recipe)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    summary = run_train(recipe)
    seconds = time.perf_counter() - started
    peak = _gib(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0.0
    logged = json.loads((run_dir / "last" / "meta.json").read_text())["metrics"]
    unquantized = tau_against_unquantized(recipe, run_dir)
    return {"setting": setting, "target_weights_gib": target_gib, "train_peak_gib": peak, "train_seconds": seconds,
            "tokens_per_s": summary["tokens_per_s"], "steps": summary["steps"], "micro_batch": micro_batch,
            "val_rows": summary["val_rows"],
            "val_tau_sim_logged": logged.get("val/tau_sim"), "val_tau_sim_vs_unquantized": unquantized["val/tau_sim"],
            "val_acc1_vs_unquantized": unquantized.get("val/acc@1")}


def table(rows: list) -> str:
    return markdown_table(
        ["setting", "target GiB", "peak GiB", "tokens/s", "train s", "val τ_sim (logged)", "val τ_sim vs bf16"],
        [[row["setting"], f"{row['target_weights_gib']:.3f}", f"{row['train_peak_gib']:.2f}",
          f"{row['tokens_per_s']:,.0f}", f"{row['train_seconds']:.0f}", f"{row['val_tau_sim_logged']:.3f}",
          f"{row['val_tau_sim_vs_unquantized']:.3f}"] for row in rows])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="what an 8/4-bit frozen target costs in simulated τ")
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    parser.add_argument("--work", default="runs/bench/quantization")
    parser.add_argument("--settings", default="none,8bit,4bit")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child process: run this setting, write its JSON
    args = parser.parse_args(argv)
    work = Path(args.work)
    if args.one:
        result = run_setting(args.recipe, args.one, work, args.steps, args.micro_batch, args.overrides)
        return {"path": str(write_report(work / f"{args.one}.json", result, args.one))}
    for setting in args.settings.split(","):
        command = [sys.executable, __file__, args.recipe, *args.overrides, "--work", str(work), "--one", setting,
                   "--steps", str(args.steps), "--micro-batch", str(args.micro_batch)]
        if subprocess.run(command, env=child_env()).returncode != 0:
            raise SystemExit(f"setting {setting} failed")
    rows = [json.loads((work / f"{s}.json").read_text()) for s in SETTINGS if (work / f"{s}.json").is_file()]
    result = {"machine": machine(), "torch": torch.__version__, "steps": args.steps, "micro_batch": args.micro_batch,
              "recipe": args.recipe, "overrides": args.overrides, "settings": rows}
    return finish(table(rows), work, result, "quantization")


if __name__ == "__main__":
    main()
