"""Defaults suite: what training's fast defaults cost in acceptance. The SmolLM2 EAGLE-3 head is trained on the same
distilled data, for the same steps, once with plain settings and once with the defaults, two seeds each (the
run-to-run noise), and each head decodes MT-bench in the runtime.

    python -m tools.bench.defaults --prompts .data/train_prompts.jsonl --out OUT -- target.path=$GGUF
    python -m tools.bench.defaults --data DISTILLED --steps 600 --parallel 2 --out OUT -- target.path=$GGUF

Settings:
  plain     train.compile=false train.activation_checkpointing=none train.optimizer=adamw train.cuda_graphs=false
            (eager, every activation kept, PyTorch's AdamW)
  defaults  the recipe as it is: compile auto (on CUDA), swiglu, optimizer auto (the fused 8-bit AdamW on CUDA),
            cuda_graphs auto (each step replayed as a CUDA graph on CUDA)
Stages, each `specdraft` in a process of its own, overrides after `--` given to every one:
  1. distill-data once (unless --data): the first --max-prompts of --prompts, distill.engine=static (the batched
     engine), distill.batch_size=--distill-batch, one shard; every run trains on it.
  2. train: each setting x --seeds (train.seed: the held-out split, the data order and the initial weights)
     with train.max_steps=--steps, train.micro_batch_size=--micro-batch, one validation at the last step.
     --parallel runs that many at once on the one GPU, in the order plain-s0, plain-s1, defaults-s0, ...:
     --parallel 2 runs each setting's seeds together (each run timed beside its twin), 4 runs all four at once
     (the fastest; every run shares the GPU with the three others, plain and defaults alike).
  3. bench each run at T=0 on the first --eval-prompts MT-bench prompts (or --eval-file's), the runtime's
     default tree, the target the run trained with (`specdraft bench RUN --temperature 0 --no-hf
     --lossless-prompts 0`), --parallel at once (τ does not depend on the timing).
Per run: held-out τ_sim (RUN/last/meta.json: the validation at the last step), MT-bench τ (bench.json), steps/s
(RUN/logs/step_times.csv after the first fifth of the logged steps, the GPU shared as --parallel says). Per
setting, the mean over the seeds; the seed-to-seed spread is the largest gap between two seeds of one setting. The
verdict for each measure: "within noise" when the defaults' mean is within the spread of the plain settings'
mean, else "better" or "worse". OUT/defaults.json; each process's log in OUT/logs; the data and runs in --work.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from tools.bench.suite import REPO, child_env, finish, fmt, kill_group, machine, markdown_table, read_json, write_report

SETTINGS = {"plain": ["train.compile=false", "train.activation_checkpointing=none", "train.optimizer=adamw",
                      "train.cuda_graphs=false"],
            "defaults": []}
MEASURES = ("tau_sim", "tau")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="held-out τ_sim, MT-bench τ and steps/s: training with plain "
                                                 "settings and with the fast defaults")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for every stage, key=value (after --)")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "eagle3_smollm2.yaml")
    parser.add_argument("--prompts", type=Path, help="training prompts to distill (or --data)")
    parser.add_argument("--max-prompts", type=int, default=3800)
    parser.add_argument("--distill-batch", type=int, default=256)
    parser.add_argument("--data", type=Path, help="distilled data to train on (default: distill --prompts)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--parallel", type=int, default=4, help="processes at once on the GPU")
    parser.add_argument("--eval-prompts", type=int, default=80, help="the first N prompts of --eval-file")
    parser.add_argument("--eval-file", type=Path, help="prompts to bench on (default: MT-bench's questions)")
    parser.add_argument("--eval-max-new-tokens", type=int, default=256)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per group of processes")
    parser.add_argument("--out", type=Path, required=True, help="OUT/defaults.json and OUT/logs")
    parser.add_argument("--work", type=Path, help="the distilled data and the runs (default OUT/work)")
    args = parser.parse_args(argv)
    args.work = args.work or args.out / "work"
    if (args.data is None) == (args.prompts is None):
        parser.error("give --prompts (distilled here) or --data (distilled before), not both")
    return args


def runs(seeds: List[int]) -> List[dict]:
    """Every (setting, seed), each setting's seeds together."""
    return [{"run": f"{setting}-s{seed}", "setting": setting, "seed": seed} for setting in SETTINGS for seed in seeds]


def run_group(argvs: List[List[str]], names: List[str], args) -> Dict[str, int]:
    """Processes started together, each logged to OUT/logs/NAME.log -> {name: exit code (-1: timed out)}."""
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    logs = [open(args.out / "logs" / f"{name}.log", "w") for name in names]
    started = [subprocess.Popen(argv, cwd=REPO, env=child_env(drop=["SLURM_"], PYTHONUNBUFFERED="1"), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True) for argv, log in zip(argvs, logs)]
    codes = {}
    try:
        for name, process in zip(names, started):
            try:
                codes[name] = process.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                codes[name] = -1
    finally:
        for process, log in zip(started, logs):
            kill_group(process)
            log.close()
    return codes


def in_groups(jobs: Dict[str, List[str]], args) -> Dict[str, int]:
    """{name: argv} run --parallel at a time, in order -> {name: exit code}."""
    names, codes = list(jobs), {}
    for start in range(0, len(names), max(1, args.parallel)):
        group = names[start:start + max(1, args.parallel)]
        codes.update(run_group([jobs[name] for name in group], group, args))
    return codes


def specdraft(*argv: str) -> List[str]:
    return [sys.executable, "-m", "specdraft.cli", *argv]


def distill(args) -> Path:
    data = args.work / "data"
    prompts = args.prompts.resolve()
    argv = specdraft("distill-data", str(args.recipe), f"data.prompts=[{prompts}]",
                     f"data.max_samples={args.max_prompts}", "distill.engine=static",
                     f"distill.batch_size={args.distill_batch}", f"distill.shard_size={args.max_prompts}",
                     f"distill.output_dir={data}", *args.overrides)
    if in_groups({"distill": argv}, args)["distill"] != 0:
        raise SystemExit(f"distill-data failed: {args.out / 'logs' / 'distill.log'}")
    return data


def train_argv(run: dict, data: Path, args) -> List[str]:
    return specdraft("train", str(args.recipe), f"distill.output_dir={data}",
                     f"train.output_dir={args.work / 'runs' / run['run']}", f"train.seed={run['seed']}",
                     f"train.max_steps={args.steps}", f"train.val_every_steps={args.steps}",
                     f"train.micro_batch_size={args.micro_batch}", *args.overrides, *SETTINGS[run["setting"]])


def bench_argv(run: dict, args) -> List[str]:
    directory = args.work / "runs" / run["run"]
    prompts = ["--prompts", str(args.eval_file.resolve())] if args.eval_file else []
    return specdraft("bench", str(directory), *prompts, "--max-prompts", str(args.eval_prompts),
                     "--max-new-tokens", str(args.eval_max_new_tokens), "--temperature", "0", "--no-hf",
                     "--lossless-prompts", "0", "--out", str(directory / "bench"))


def steps_per_s(run_dir: Path) -> Optional[float]:
    """Optimizer steps a second after the first fifth of the logged steps (compiles and warm-up left out)."""
    from specdraft.train.timing import read_step_times

    path = run_dir / "logs" / "step_times.csv"
    rows = read_step_times(path) if path.is_file() else []
    start = len(rows) // 5
    if len(rows) - start < 2 or rows[-1][1] <= rows[start][1]:
        return None
    return (rows[-1][0] - rows[start][0]) / (rows[-1][1] - rows[start][1])


def collect(run: dict, args, codes: Dict[str, int]) -> dict:
    directory = args.work / "runs" / run["run"]
    last = read_json(directory / "last" / "meta.json")
    return {**run, "train_exit": codes.get(f"train-{run['run']}"), "bench_exit": codes.get(f"bench-{run['run']}"),
            "steps": last.get("step"), "steps_per_s": steps_per_s(directory),
            "tau_sim": last.get("metrics", {}).get("val/tau_sim"),
            "tau": read_json(directory / "bench" / "bench.json").get("tau")}


def verdict(results: List[dict]) -> dict:
    """Per measure: each setting's mean, the seed-to-seed spread, the defaults' difference and the verdict."""
    summary = {}
    for measure in (*MEASURES, "steps_per_s"):
        values = {setting: [r[measure] for r in results if r["setting"] == setting and r[measure] is not None]
                  for setting in SETTINGS}
        if not all(values.values()):
            summary[measure] = {"verdict": "missing runs"}
            continue
        means = {setting: statistics.fmean(v) for setting, v in values.items()}
        spread = max(max(v) - min(v) for v in values.values())
        difference = means["defaults"] - means["plain"]
        outcome = "within noise" if abs(difference) <= spread else ("better" if difference > 0 else "worse")
        summary[measure] = {"means": means, "spread": spread, "difference": difference,
                            "relative": difference / means["plain"] if means["plain"] else None,
                            "verdict": outcome}
    return summary


def table(report: dict) -> str:
    rows = [[r["run"], r["seed"], fmt(r["steps"], ""), fmt(r["steps_per_s"], ".2f"), fmt(r["tau_sim"], ".3f"),
             fmt(r["tau"], ".3f")] for r in report["runs"]]
    text = markdown_table(["run", "seed", "steps", "steps/s", "held-out τ_sim", "MT-bench τ"], rows)
    lines = []
    for measure, name in (("tau_sim", "held-out τ_sim"), ("tau", "MT-bench τ"), ("steps_per_s", "steps/s")):
        found = report["verdict"][measure]
        if "means" not in found:
            lines.append([name, "", "", "", "", found["verdict"]])
            continue
        lines.append([name, f"{found['means']['plain']:.3f}", f"{found['means']['defaults']:.3f}",
                      f"{found['difference']:+.3f} ({100 * (found['relative'] or 0):+.1f}%)",
                      f"{found['spread']:.3f}", found["verdict"]])
    return text + "\n\n" + markdown_table(["measure", "plain (mean)", "defaults (mean)", "difference",
                                           "seed-to-seed spread", "verdict"], lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.recipe = args.recipe.resolve()
    data = args.data.resolve() if args.data else distill(args)
    planned = runs(args.seeds)
    codes = in_groups({f"train-{run['run']}": train_argv(run, data, args) for run in planned}, args)
    codes.update(in_groups({f"bench-{run['run']}": bench_argv(run, args) for run in planned
                            if codes[f"train-{run['run']}"] == 0}, args))
    results = [collect(run, args, codes) for run in planned]
    report = {"machine": machine(), "recipe": str(args.recipe), "data": str(data), "settings": SETTINGS,
              "steps": args.steps, "micro_batch": args.micro_batch, "parallel": args.parallel,
              "eval_prompts": args.eval_prompts, "overrides": args.overrides,
              "distill": read_json(data / "throughput.json"), "runs": results, "verdict": verdict(results)}
    write_report(args.out, report, "defaults")
    return finish(table(report), args.out, report, "defaults")


if __name__ == "__main__":
    main()
