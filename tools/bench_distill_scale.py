"""distill-data throughput with 1, 2, ... workers, one GPU each (data_gen/workers.py), on the recipe's target.

Each worker count W runs `specdraft distill-data RECIPE distill.num_workers=W distill.worker_index=i` as W
processes at once (worker i sees only GPU i), into its own output dir; the last worker merges. Reported from the
merged throughput.json: answer tokens per second of wall-clock time from the first worker's first generation
to the last worker's end (target loading excluded), the sum of the workers' own generation rates, and the
efficiency tokens/s(W) / (W x tokens/s(1)). Prints a table, writes DIR/bench_distill_scale.json.

    python tools/bench_distill_scale.py --workers 1,2 --out runs/bench_distill -- \\
        target.path=$GGUF data.prompts=[$PWD/.data/train_prompts.jsonl] data.max_samples=1024 \\
        distill.batch_size=256 distill.shard_size=64 distill.max_new_tokens=256
    python tools/bench_distill_scale.py --device cpu --workers 1,2 --recipe R --out DIR -- OVERRIDES   # CPU

Overrides after `--` go to every worker (the output dir is set per worker count).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_workers(args, count: int) -> dict:
    """`count` distill-data workers at once -> the merged throughput and the launch-to-end wall time."""
    out = args.out / f"workers-{count}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    base["PYTHONPATH"] = f"{REPO}{os.pathsep}{base.get('PYTHONPATH', '')}"
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    started, workers = time.perf_counter(), []
    for index in range(count):
        env = {**base, "CUDA_VISIBLE_DEVICES": str(index) if args.device == "cuda" else ""}
        if args.device == "cpu":
            env["OMP_NUM_THREADS"] = "1"
        argv = [sys.executable, "-m", "specdraft.cli", "distill-data", str(args.recipe), *args.overrides,
                f"distill.output_dir={out}", f"distill.num_workers={count}", f"distill.worker_index={index}"]
        log = open(args.out / "logs" / f"workers-{count}-{index}.log", "w")
        workers.append((subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    for process, log in workers:
        process.wait(timeout=args.timeout)
        log.close()
        if process.returncode != 0:
            raise RuntimeError(f"a worker of {count} failed (exit {process.returncode}); see {args.out / 'logs'}")
    merged = json.loads((out / "throughput.json").read_text())
    return {"workers": count, "tokens_per_s": merged["wall_tokens_per_s"],
            "sum_of_worker_rates": merged["tokens_per_s"], "generated_tokens": merged["generated_tokens"],
            "generation_wall_seconds": merged["wall_seconds"], "launch_to_end_seconds": time.perf_counter() - started,
            "counts": json.loads((out / "counts.json").read_text())}


def add_efficiency(results: list) -> list:
    base = next((r for r in results if r["workers"] == 1), None)
    for result in results:
        result["efficiency"] = result["tokens_per_s"] / (result["workers"] * base["tokens_per_s"]) if base else None
    return results


def table(results: list) -> str:
    lines = [f"{'workers':>7} {'tokens/s':>10} {'sum of rates':>12} {'efficiency':>10} {'answer tokens':>13}"]
    for r in results:
        efficiency = f"{100 * r['efficiency']:.1f}%" if r["efficiency"] is not None else "-"
        lines.append(f"{r['workers']:>7} {r['tokens_per_s']:>10.0f} {r['sum_of_worker_rates']:>12.0f} "
                     f"{efficiency:>10} {r['generated_tokens']:>13}")
    return "\n".join(lines)


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "eagle3_smollm2.yaml")
    parser.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2,4 (one GPU each)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per worker count")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.workers = [int(n) for n in args.workers.split(",")]
    args.overrides = overrides
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    results = add_efficiency([run_workers(args, count) for count in args.workers])
    report = {"recipe": str(args.recipe), "overrides": args.overrides, "device": args.device, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_distill_scale.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"-> {args.out / 'bench_distill_scale.json'}")
    return report


if __name__ == "__main__":
    main()
