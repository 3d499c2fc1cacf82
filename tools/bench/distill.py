"""Distillation suite: distill-data throughput with 1, 2, ... workers, one GPU each (specdraft/distill/workers.py), on
the recipe's target (`workers`, the default); and its two answer engines, Hugging Face generate and the static
batched engine, side by side on one GPU (`engines`).

Each worker count W runs `specdraft distill-data RECIPE distill.num_workers=W distill.worker_index=i` as W
processes at once (worker i sees only GPU i), into its own output dir; the last worker merges. Reported from the
merged throughput.json: answer tokens per second of wall-clock time from the first worker's first generation
to the last worker's end (target loading excluded), the sum of the workers' own generation rates (time inside
generate only: the steady rate, free of start-up skew between workers), and the efficiencies
tokens/s(W) / (W x tokens/s(1)) of both. Prints a table, writes OUT/distill.json after every worker count. A
worker count that fails or outlasts --timeout (its workers are stopped) is recorded with its error and the next
one runs.

    python -m tools.bench.distill --workers 1,2,4 --out runs/bench -- \\
        target.path=$GGUF data.prompts=[$PWD/.data/train_prompts.jsonl] data.max_samples=1024 \\
        distill.batch_size=256 distill.shard_size=64 distill.max_new_tokens=256
    python -m tools.bench.distill --device cpu --workers 1,2 --recipe R --out DIR -- OVERRIDES   # CPU

Overrides after `--` go to every worker (the output dir is set per worker count).

`engines`: in one process, `distill-data` on the first --max-prompts prompts of --prompts with distill.engine=hf
and then =static, at the same distill.batch_size (--batch-size), in the recipe's dtype (bf16 on a GPU), each after
a warm-up run of its own (--batch-size prompts, 16 new tokens: kernels compiled, libraries loaded); answer tokens
per second of time inside generation (throughput.json) and the speedup of static over hf. Then both again in
float32 on the first --identity-prompts prompts: how many conversations (every answer of each) are identical
token for token. One shard holds all prompts, so the static engine keeps its rows busy until the last ones.
OUT/distill_engines.json, OUT/engines/RUN/ (each run's output dir).

    python -m tools.bench.distill engines --prompts train_prompts.jsonl --out runs/bench      # SmolLM2, batch 256
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from tools.bench.suite import (REPO, child_env, finish, fmt, kill_group, machine, markdown_table, run_parts,
                                write_report)


def _environment(args, index: int) -> dict:
    env = child_env(drop=["SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"])
    env["CUDA_VISIBLE_DEVICES"] = str(index) if args.device == "cuda" else ""
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    return env


def _wait_all(processes: list, timeout: float) -> None:
    """Wait for every worker until one shared deadline; then (on timeout too) kill whatever is left of each
    worker's process group, so that no stray process holds a GPU for the next worker count."""
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            kill_group(process)


def run_workers(args, count: int) -> dict:
    """`count` distill-data workers at once -> the merged throughput and the launch-to-end wall time."""
    out = args.out / f"workers-{count}"
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started, processes = time.perf_counter(), []
    for index in range(count):
        argv = [sys.executable, "-m", "specdraft.cli", "distill-data", str(args.recipe), *args.overrides,
                f"distill.output_dir={out}", f"distill.num_workers={count}", f"distill.worker_index={index}"]
        with open(logs / f"workers-{count}-{index}.log", "w") as log:
            processes.append(subprocess.Popen(argv, cwd=REPO, env=_environment(args, index), stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
    _wait_all(processes, args.timeout)
    failed = [i for i, process in enumerate(processes) if process.returncode != 0]
    if failed:
        raise RuntimeError(f"worker(s) {failed} of {count} failed; see {logs}/workers-{count}-{failed[0]}.log")
    merged = json.loads((out / "throughput.json").read_text())
    return {"tokens_per_s": merged["wall_tokens_per_s"], "sum_of_worker_rates": merged["tokens_per_s"],
            "generated_tokens": merged["generated_tokens"], "generation_wall_seconds": merged["wall_seconds"],
            "launch_to_end_seconds": time.perf_counter() - started,
            "counts": json.loads((out / "counts.json").read_text())}


def run_one(args, count: int) -> dict:
    """One worker count -> its result, status "ok" or the error (a failure never stops the benchmark)."""
    result = {"workers": count, "status": "ok"}
    try:
        result.update(run_workers(args, count))
    except subprocess.TimeoutExpired:
        result["status"] = f"timeout after {args.timeout} s"
    except Exception as err:  # recorded; the next worker count still runs
        result["status"] = f"error: {type(err).__name__}: {err}"[:2000]
    print(f"{count} worker(s): {result['status']}", flush=True)
    return result


def add_efficiency(results: list) -> list:
    base = next((r for r in results if r["workers"] == 1 and r["status"] == "ok"), None)
    for result in results:
        ok = result["status"] == "ok" and base is not None
        result["efficiency"] = result["tokens_per_s"] / (result["workers"] * base["tokens_per_s"]) if ok else None
        result["efficiency_generate"] = result["sum_of_worker_rates"] / (
            result["workers"] * base["sum_of_worker_rates"]) if ok else None
    return results


def table(results: list) -> str:
    rows = []
    for r in results:
        if r["status"] != "ok":
            rows.append([r["workers"], r["status"][:100], "", "", "", ""])
            continue
        percent = ["-" if v is None else f"{100 * v:.1f}%" for v in (r["efficiency"], r["efficiency_generate"])]
        rows.append([r["workers"], f"{r['tokens_per_s']:,.0f}", f"{r['sum_of_worker_rates']:,.0f}", *percent,
                     f"{r['generated_tokens']:,}"])
    return markdown_table(["workers", "answer tokens/s (wall)", "sum of workers' rates", "efficiency (wall)",
                           "efficiency (rates)", "answer tokens"], rows)


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description="distill-data answer tokens/s with 1, 2, ... workers")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "eagle3_smollm2.yaml")
    parser.add_argument("--workers", default=None, help="worker counts, e.g. 1,2,4 (one GPU each; default 1, 2 and "
                                                         "4 as far as GPUs are present, 1,2 on the CPU)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per worker count")
    parser.add_argument("--out", type=Path, required=True, help="a directory: OUT/distill.json, OUT/logs, "
                                                                "OUT/workers-W")
    args = parser.parse_args(argv)
    if args.workers is None:
        args.workers = ",".join(str(n) for n in (1, 2, 4) if n <= max(_gpu_count(args.device), 1))
    args.workers = [int(n) for n in args.workers.split(",")]
    args.overrides = overrides
    return args


def _gpu_count(device: str) -> int:
    if device == "cpu":
        return 2
    import torch

    return torch.cuda.device_count()


def workers(argv=None) -> dict:
    args = parse_args(argv)
    report = {"recipe": str(args.recipe), "overrides": args.overrides, "device": args.device,
              "machine": machine(args.device), "results": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for count in args.workers:
        report["results"].append(run_one(args, count))
        add_efficiency(report["results"])
        write_report(args.out, report, "distill")
    return finish(table(report["results"]), args.out, report, "distill")


ENGINE_RUNS = [("hf", "auto"), ("static", "auto"), ("hf", "float32"), ("static", "float32")]


def _engine_recipe(args, engine: str, dtype: str, samples: int, out: Path, max_new_tokens: Optional[int] = None):
    from specdraft.recipes import load_recipe

    overrides = [*args.overrides, f"data.prompts=[{args.prompts.resolve()}]", f"data.max_samples={samples}",
                 f"distill.batch_size={args.batch_size}", f"distill.shard_size={samples}",
                 f"distill.engine={engine}", f"target.dtype={dtype}", f"distill.output_dir={out}"]
    if max_new_tokens is not None:
        overrides.append(f"distill.max_new_tokens={max_new_tokens}")
    return load_recipe(args.recipe, overrides)


def _distill(args, engine: str, dtype: str, samples: int, name: str, max_new_tokens: Optional[int] = None) -> dict:
    """One fresh distill-data run in this process -> its throughput, counts and wall time."""
    import torch

    from specdraft.distill.run import run_distill

    out = args.out / "engines" / name
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    counts = run_distill(_engine_recipe(args, engine, dtype, samples, out, max_new_tokens), device=args.device)
    wall = time.perf_counter() - started
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    merged = json.loads((out / "throughput.json").read_text())
    return {"engine": engine, "dtype": dtype, "prompts": samples, "batch_size": args.batch_size, "counts": counts,
            "generated_tokens": merged["generated_tokens"], "generate_seconds": merged["generate_seconds"],
            "tokens_per_s": merged["tokens_per_s"], "run_seconds": wall, "out": str(out)}


def identical_conversations(first: Path, second: Path) -> dict:
    """Rows of two distilled datasets compared by conversation: how many hold the same token ids."""
    from datasets import load_from_disk

    ids = [{row["index"]: row["input_ids"] for row in load_from_disk(str(path / "dataset"))} for path in (first,
                                                                                                          second)]
    indices = sorted(set(ids[0]) | set(ids[1]))
    differ = [index for index in indices if ids[0].get(index) != ids[1].get(index)]
    return {"identical": len(indices) - len(differ), "compared": len(indices),
            "first_difference": differ[0] if differ else None}


def engine_runs(args) -> list:
    """Warm-up and timed runs of both engines, then the float32 pair; each row with its speedup and identity."""
    results = []
    for engine, dtype in ENGINE_RUNS:
        samples = args.max_prompts if dtype == "auto" else args.identity_prompts
        _distill(args, engine, dtype, min(args.batch_size, samples), f"warmup-{engine}-{dtype}", max_new_tokens=16)
        results.append(_distill(args, engine, dtype, samples, f"{engine}-{dtype}"))
        print(f"{engine} ({dtype}): {results[-1]['tokens_per_s']:,.0f} answer tokens/s", flush=True)
    for hf, static in (results[0:2], results[2:4]):
        static["speedup_vs_hf"] = static["tokens_per_s"] / max(hf["tokens_per_s"], 1e-9)
        static["same_as_hf"] = identical_conversations(Path(hf["out"]), Path(static["out"]))
    return results


def engines_table(results: list) -> str:
    rows = []
    for r in results:
        same = r.get("same_as_hf")
        rows.append([r["engine"], r["dtype"], r["prompts"], r["batch_size"], f"{r['generated_tokens']:,}",
                     f"{r['generate_seconds']:.1f}", f"{r['tokens_per_s']:,.0f}", fmt(r.get("speedup_vs_hf"), ".2f"),
                     f"{same['identical']}/{same['compared']}" if same else "-"])
    return markdown_table(["engine", "dtype", "prompts", "batch", "answer tokens", "seconds generating",
                           "answer tokens/s", "x hf", "conversations identical to hf"], rows)


def engines(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description="distill-data's engines, hf and static, on one device")
    parser.add_argument("--prompts", type=Path, required=True, help="a prompt file (any form data.prompts reads)")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "eagle3_smollm2.yaml")
    parser.add_argument("--batch-size", type=int, default=256, help="distill.batch_size of both engines")
    parser.add_argument("--max-prompts", type=int, default=512, help="prompts of the timed runs")
    parser.add_argument("--identity-prompts", type=int, default=100, help="prompts of the float32 runs")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True, help="a directory: OUT/distill_engines.json, OUT/engines/")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.overrides = overrides
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"recipe": str(args.recipe), "prompts": str(args.prompts), "overrides": overrides,
              "device": args.device, "machine": machine(args.device), "results": engine_runs(args)}
    return finish(engines_table(report["results"]), args.out, report, "distill_engines")


def main(argv=None):
    return run_parts({"workers": workers, "engines": engines}, argv)


if __name__ == "__main__":
    main()
