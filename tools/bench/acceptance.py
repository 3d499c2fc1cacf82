"""Acceptance suite: τ and acceptance by position of trained drafts, end to end: distill-data once, then for each
run train -> export -> `specdraft eval` (plain chain speculative decoding against the target, lossless-checked),
with the distill and training throughput and the held-out simulated τ beside.

    python -m tools.bench.acceptance --work runs/bench/acceptance          # the smoke path on the CPU, ~3 minutes
    python -m tools.bench.acceptance --recipes recipes --runs eagle3 poss2 --data DISTILLED --work DIR \\
        target.path=$GGUF data.max_length=1024 train.micro_batch_size=32 train.max_steps=2500

A run is a method of the recipes in --recipes (DIR/eagle3_smollm2.yaml, DIR/poss_smollm2.yaml,
DIR/kangaroo_smollm2.yaml): eagle3, poss1, poss2, poss3 (PosS with 6, 3 or 2 specialists: 1, 2 or 3 positions
each) or kangaroo<L> (exit layer L), optionally with overrides of its own after a colon
(`poss2:method.init_from=EXPORT,train.lr=3e-4`). Every run trains on the same distilled data (--data, or the
first run's recipe distilled into WORK/data) with the same overrides (key=value, given to every stage), so the
runs differ by their method alone. Prints a table and writes WORK/acceptance.json; `--collect` only reads a WORK
filled before.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Tuple

from tools.bench.suite import finish, fmt, machine, markdown_table, read_json, specdraft_stage

import torch

METHOD_RUNS = {"eagle3": ("eagle3", []),
               "poss1": ("poss", ["method.positions_per_specialist=1", "method.num_specialists=6"]),
               "poss2": ("poss", ["method.positions_per_specialist=2", "method.num_specialists=3"]),
               "poss3": ("poss", ["method.positions_per_specialist=3", "method.num_specialists=2"])}


def run_spec(text: str, recipes: Path) -> Tuple[str, str, List[str]]:
    """'poss2:key=value,...' -> (name, recipe path, the run's overrides: its method's, then its own)."""
    name, _, own = text.partition(":")
    if name.startswith("kangaroo") and name[len("kangaroo"):].isdigit():
        method, overrides = "kangaroo", [f"method.exit_layer={name[len('kangaroo'):]}"]
    elif name in METHOD_RUNS:
        method, overrides = METHOD_RUNS[name]
    else:
        raise SystemExit(f"unknown run {name!r}: eagle3, poss1, poss2, poss3 or kangaroo<L>")
    return name, str(recipes / f"{method}_smollm2.yaml"), [*overrides, *filter(None, own.split(","))]


def run_stages(runs: List[Tuple[str, str, List[str]]], work: Path, data: Path, overrides: List[str],
               distill: bool) -> None:
    if distill:
        specdraft_stage(["distill-data", runs[0][1], f"distill.output_dir={data}", *overrides])
    for name, recipe, own in runs:
        run = work / name
        specdraft_stage(["train", recipe, f"distill.output_dir={data}", f"train.output_dir={run / 'train'}", *overrides,
                         *own])
        specdraft_stage(["export", str(run / "train"), "--format", "hf", "--out", str(run / "export")])
        specdraft_stage(["eval", str(run / "export"), *overrides])


def collect_run(name: str, run: Path) -> dict:
    from specdraft.drafts import load_draft

    train, best = read_json(run / "train" / "train_summary.json"), read_json(run / "train" / "best" / "meta.json")
    evaluation = read_json(run / "export" / "eval.json")
    params = sum(p.numel() for p in load_draft(run / "export").draft.parameters()) \
        if (run / "export" / "config.json").is_file() else None
    return {"run": name, "trainable_params": params, "train_steps": train.get("steps"),
            "train_tokens_per_s": train.get("tokens_per_s"),
            "val_tau_sim_best": best.get("metrics", {}).get("val/tau_sim"), "best_step": best.get("step"),
            "eval_tau": evaluation.get("tau"), "eval_lossless": evaluation.get("lossless"),
            "eval_prompts": evaluation.get("prompts"),
            "acceptance_by_position": evaluation.get("acceptance_by_position")}


def table(report: dict) -> str:
    rows = [[r["run"], fmt(r["trainable_params"], ","), fmt(r["train_steps"], ""),
             fmt(r["train_tokens_per_s"], ",.0f"), fmt(r["val_tau_sim_best"], ".3f"), fmt(r["eval_tau"], ".3f"),
             " ".join(f"{v:.2f}" for v in r["acceptance_by_position"] or []), fmt(r["eval_lossless"], "")]
            for r in report["runs"]]
    distill = report["distill"]
    head = (f"distill: {distill['conversations']} conversations at {fmt(distill['tokens_per_s'], ',.0f')} answer "
            f"tokens/s\n\n") if distill.get("conversations") is not None else ""
    return head + markdown_table(["run", "params", "steps", "train tokens/s", "held-out τ_sim", "τ",
                                  "acceptance by position", "lossless"], rows)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="τ and acceptance of trained drafts, end to end")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for every stage, key=value")
    parser.add_argument("--runs", nargs="+", default=["eagle3"], help="eagle3, poss1-3, kangaroo<L>[:key=value,...]")
    parser.add_argument("--recipes", type=Path, default=Path("recipes/smoke"),
                        help="where the runs' recipes are (default: the CPU smoke recipes)")
    parser.add_argument("--data", type=Path, default=None, help="distilled data to train on (default: distill "
                                                                 "the first run's recipe into WORK/data)")
    parser.add_argument("--work", type=Path, default=Path("runs/bench/acceptance"))
    parser.add_argument("--collect", action="store_true", help="only read an existing WORK")
    args = parser.parse_args(argv)
    runs = [run_spec(text, args.recipes) for text in args.runs]
    data = args.data or args.work / "data"
    if not args.collect:
        run_stages(runs, args.work, data, args.overrides, distill=args.data is None)
    throughput, counts = read_json(data / "throughput.json"), read_json(data / "counts.json")
    report = {"machine": machine(), "torch": torch.__version__, "recipes": str(args.recipes),
              "overrides": args.overrides, "data": str(data),
              "distill": {"conversations": counts.get("ok"), "tokens_per_s": throughput.get("tokens_per_s")},
              "runs": [collect_run(name, args.work / name) for name, _, _ in runs]}
    return finish(table(report), args.work, report, "acceptance")


if __name__ == "__main__":
    main()
