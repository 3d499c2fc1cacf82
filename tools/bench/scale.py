"""Scaling suite: EAGLE-3 training throughput at 1, 2 and 4 GPUs, ZeRO-2 and ZeRO-3, through the real `specdraft
train` (`train`, the default); and the host work ZeRO-3 adds on a CPU: a draft's forward under each stage
(`zero3-host`) and the frozen target's forward under DeepSpeed's linear and PyTorch's (`target-linear`).

    python -m tools.bench.scale --out runs/bench                                # the GPUs present: 1, 2, 4
    python -m tools.bench.scale --strategies deepspeed_stage_3:shard --gpus 2,4 --out DIR
    python -m tools.bench.scale --config tiny --device cpu --out /tmp/bench     # tiny model, CPU, ddp
    python -m tools.bench.scale --gpus 1,2 --strategies deepspeed_stage_3 --profile 2 --out DIR   # where it goes
    python -m tools.bench.scale --gpus 1,4 --warmup 5 --steps 30 --phases --out DIR  # every rank's phases
    python -m tools.bench.scale --gpus 1,2,4 --profile 3 --trace --nccl-channels 4,8 --out DIR  # NCCL's overlap
    python -m tools.bench.scale overlap DIR/work/runs/deepspeed_stage_2-4/trace.json --steps 3   # one trace's
    python -m tools.bench.scale zero3-host --steps 300 --out DIR                 # CPU: 2, 3, 3-whole
    python -m tools.bench.scale target-linear --steps 200 --out DIR              # CPU
    python -m tools.bench.scale cli --out DIR      # specdraft train with recipes/eagle3_llama3.yaml beside the harness

`train`: the target is Llama-3.1-8B-shaped (hidden 4096, 32 layers, 32 heads, 8 KV heads, MLP 14336, vocabulary
128256, llama3 RoPE scaling) with random weights (`target.random_init`: a directory with config.json and a
tokenizer only); `--config smollm2` has SmolLM2-135M's shapes. The data are synthetic distilled rows of 2048
tokens (the last three quarters answers). Each (strategy, GPU count) is one `specdraft train` process (Lightning
starts the ranks), micro-batch 1 per GPU, no checkpoints. Tokens/s are steady-state: from the run's per-step wall
times (RUN/logs/step_times.csv, the device synchronized at each step end), over the steps after --warmup
(compiles, allocator growth); efficiency(N) = tokens/s(N) / (N x tokens/s(1)). A strategy
`deepspeed_stage_3:shard` runs ZeRO-3 with the target partitioned across the GPUs (train.shard_target=true);
plain `deepspeed_stage_3` replicates it (auto: an 8B target fits every GPU). A configuration that fails or
outlasts --timeout is recorded with its error (and its log's last lines) and the next one runs; OUT/scale.json is
rewritten after every configuration, so an interrupted run keeps what it measured. Each run's log is
OUT/logs/STRATEGY-N.log. On the CPU DeepSpeed is not available (Lightning runs it on CUDA only), so the tiny CPU
run measures ddp with 1 and 2 processes.

`--nccl-channels 4,8` adds, beside every multi-GPU configuration, one run per value with NCCL_MAX_NCHANNELS set
to it: fewer channels take fewer SMs from the kernels NCCL shares the device with (the next batch's target
forward, prefetched on a side stream), at some bandwidth. Every process the suite starts keeps NVLink multicast off
(MULTICAST_OFF). With `--trace`, rank 0's Chrome trace is read (`nccl_overlap`): per step, the device time of
NCCL's kernels, how much of it ran while compute kernels ran (overlapped, by compute stream too) and how much
ran alone (exposed: what the step waits for), beside the device's idle time. `overlap TRACE` reads one trace.

`cli`: tools/bench/train_cli.py (its docstring says what it runs).

`zero3-host`, `target-linear`: tools/bench/scale_host.py (its docstring says what they measure).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from tools.bench import scale_host, train_cli
from tools.bench.scale_runs import (CONFIGS, MULTICAST_OFF, log_tail, run_process_group, train_env, write_rows,
                                    write_target)
from tools.bench.suite import finish, machine, markdown_table, run_parts, write_report

import numpy as np

def write_recipe(work: Path, spec: dict, dtype: str) -> Path:
    path = work / "recipe.yaml"
    path.write_text(f"""# tools/bench/scale.py: random-weight target, synthetic rows (benchmark only)
target: {{path: {work / 'target'}, dtype: {dtype}, random_init: true}}
method: {{name: eagle3, ttt_steps: {spec['ttt_steps']}, draft_vocab_size: {spec['draft_vocab_size']}}}
data: {{max_length: {spec['seq_len']}, val_fraction: 0.01}}
distill: {{output_dir: {work / 'data'}}}
train: {{micro_batch_size: 1, lr: 1.0e-4, warmup_steps: 1, log_every_steps: 1, seed: 0}}
""")
    return path


def config_name(strategy: str, gpus: int, channels: Optional[int] = None) -> str:
    """STRATEGY-N, or STRATEGY-N-chC with NCCL_MAX_NCHANNELS=C: a configuration's run directory and log name."""
    return f"{strategy.replace(':', '-')}-{gpus}" + (f"-ch{channels}" if channels else "")


def configurations(args) -> Iterator[Tuple[str, int, Optional[int]]]:
    """(strategy, GPUs, NCCL channels or None: NCCL's own) in the order they run: every strategy at every GPU count,
    and each --nccl-channels value beside every multi-GPU count (one GPU reduces nothing across devices)."""
    for strategy in args.strategies:
        for gpus in args.gpus:
            yield strategy, gpus, None
            for channels in args.nccl_channels if gpus > 1 else ():
                yield strategy, gpus, channels


def run_dir(work: Path, strategy: str, gpus: int, channels: Optional[int] = None) -> Path:
    return work / "runs" / config_name(strategy, gpus, channels)


def train_dir(work: Path, strategy: str, gpus: int, args, channels: Optional[int] = None) -> Path:
    """The run's train.output_dir: the run directory, or (--profile, --phases) profile_train's `train` inside it."""
    folder = run_dir(work, strategy, gpus, channels)
    return folder / "train" if args.profile or args.phases else folder


def train_argv(work: Path, recipe: Path, strategy: str, gpus: int, args, channels: Optional[int] = None) -> list:
    """The `specdraft train` command of one configuration (`STRATEGY:shard`: the target partitioned); with
    --profile, tools/profile_train.py running the same recipe and overrides, its last steps under the profiler;
    with --phases, the same with every timed step's phases timed instead."""
    name, _, option = strategy.partition(":")
    steps = args.warmup + args.steps
    overrides = [f"train.output_dir={train_dir(work, strategy, gpus, args, channels)}", f"train.strategy={name}",
                 f"train.devices={gpus}", f"train.max_steps={steps}", f"train.val_every_steps={steps + 1}",
                 f"train.shard_target={'true' if option == 'shard' else 'auto'}"]
    overrides += args.override
    if not (args.profile or args.phases):
        return [sys.executable, "-m", "specdraft.cli", "train", str(recipe), *overrides]
    warmup, timed = (args.warmup, args.steps) if args.phases else (steps - args.profile, args.profile)
    flags = ["--phases"] * args.phases + ["--trace"] * args.trace + ["--blocking-sync"] * args.blocking_sync \
        + ["--pin-cores"] * args.pin_cores + ["--split-forward"] * args.split_forward
    return [sys.executable, "-m", "tools.profile_train", str(recipe), *overrides, "--warmup", str(warmup),
            "--steps", str(timed), "--out", str(run_dir(work, strategy, gpus, channels)), *flags]


def measure(work: Path, strategy: str, gpus: int, args, channels: Optional[int] = None) -> dict:
    """One configuration's steady tokens/s from its step times (with --trace, rank 0's NCCL overlap too); raises
    on a failed or unmeasurable run."""
    from specdraft.train.timing import read_step_times, steady_rate

    log_path = args.out / "logs" / f"{config_name(strategy, gpus, channels)}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        returncode = run_process_group(train_argv(work, args.recipe, strategy, gpus, args, channels),
                                       train_env(args.device, channels), log, args.timeout)
    if returncode != 0:
        raise RuntimeError(f"exit {returncode}: {log_tail(log_path, 3)}")
    rows = read_step_times(train_dir(work, strategy, gpus, args, channels) / "logs" / "step_times.csv")
    rate = steady_rate(rows, args.warmup)
    if rate is None:
        raise RuntimeError(f"{len(rows)} timed steps: too few after {args.warmup} warm-up steps")
    step_seconds = np.diff([seconds for _, seconds, _ in rows[max(0, args.warmup - 1):]])
    result = {"tokens_per_s": rate, "tokens_per_s_per_gpu": rate / gpus, "timed_steps": len(step_seconds),
              "step_seconds_median": float(np.median(step_seconds)), "first_step_seconds": rows[0][1]}
    if args.phases:
        result["phase_ms_median_by_rank"] = phases_by_rank(run_dir(work, strategy, gpus, channels))
    if args.trace:
        result["nccl_overlap"] = nccl_overlap(run_dir(work, strategy, gpus, channels) / "trace.json", args.profile)
    return result


def phases_by_rank(directory: Path) -> list:
    """Each rank's medians per step phase, from tools/profile_train.py --phases, rank 0 first: NAME its wall ms,
    and NAME_M for each other measure M (cpu: the main thread's CPU ms; preemptions; wait: ms inside CUDA
    synchronizations; sys: kernel CPU ms; page_faults; cuda_mallocs, cuda_frees and alloc_retries: the caching
    allocator's), and `canary`: its host canary's median ms (profile_train.host_canary_ms)."""
    reports = sorted((json.loads(path.read_text()) for path in directory.glob("profile_train*.json")),
                     key=lambda report: report["rank"])
    return [{**{f"{name}{_measure_suffix(key)}": value for key, medians in report.items()
                if key.startswith("phase_") and key.endswith("_median") for name, value in medians.items()},
             "canary": report["canary_ms_median"]} for report in reports]


def _measure_suffix(key: str) -> str:
    """phase_ms_median -> ""; phase_cpu_ms_median -> "_cpu"; phase_preemptions_median -> "_preemptions"."""
    measure = key[len("phase_"):-len("_median")]
    return "" if measure == "ms" else "_" + measure.removesuffix("_ms")


def run_one(work: Path, strategy: str, gpus: int, args, channels: Optional[int] = None) -> dict:
    """One configuration -> its result, status "ok" or the error (a failure never stops the benchmark)."""
    result = {"strategy": strategy, "gpus": gpus, "nccl_channels": channels, "status": "ok"}
    started = time.perf_counter()
    try:
        result.update(measure(work, strategy, gpus, args, channels))
    except subprocess.TimeoutExpired:
        result["status"] = f"timeout after {args.timeout} s"
    except Exception as err:  # recorded; the next configuration still runs
        result["status"] = f"error: {type(err).__name__}: {err}"[:2000]
    result["wall_seconds"] = time.perf_counter() - started
    setting = f" NCCL_MAX_NCHANNELS={channels}" if channels else ""
    print(f"{strategy} x{gpus}{setting}: {result['status'].splitlines()[0]} ({result['wall_seconds']:.0f} s)",
          flush=True)
    return result


def add_efficiency(results: list) -> list:
    for result in results:
        base = next((r for r in results if r["strategy"] == result["strategy"] and r["gpus"] == 1
                     and r["status"] == "ok"), None)
        ok = result["status"] == "ok" and base is not None
        result["efficiency"] = result["tokens_per_s"] / (result["gpus"] * base["tokens_per_s"]) if ok else None
    return results


def table(results: list) -> str:
    """The rates; a column of NCCL channel settings when some row set one, and with --trace a second table of
    rank 0's NCCL overlap."""
    channels = any(r.get("nccl_channels") for r in results)
    rows = []
    for r in results:
        config = [r["strategy"], r["gpus"]] + ([r.get("nccl_channels") or "NCCL's"] if channels else [])
        if r["status"] != "ok":
            rows.append(config + [r["status"].splitlines()[0][:90], "", "", ""])
            continue
        rows.append(config + [f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s_per_gpu']:,.0f}",
                              f"{r['step_seconds_median']:.3f} s",
                              "-" if r["efficiency"] is None else f"{100 * r['efficiency']:.1f}%"])
    header = ["strategy", "GPUs"] + (["NCCL channels"] if channels else [])
    rates = markdown_table(header + ["tokens/s", "per GPU", "step (median)", "efficiency"], rows)
    overlaps = [r for r in results if r["status"] == "ok" and "nccl_overlap" in r]
    return rates + ("\n\n" + overlap_table(overlaps, header) if overlaps else "")


def overlap_table(results: list, header: List[str]) -> str:
    """Rank 0's NCCL overlap per step, one row a configuration (`header`'s columns first)."""
    rows = []
    for r in results:
        o = r["nccl_overlap"]
        streams = ", ".join(f"{stream}: {ms:.1f}" for stream, ms in o["overlapped_ms_by_stream"].items())
        cells = [f"{o['nccl_ms']:.1f}", f"{o['overlapped_ms']:.1f}", f"{o['exposed_ms']:.1f}",
                 f"{o['compute_ms']:.1f}", f"{o['idle_ms']:.1f}", streams or "-"]
        rows.append([r["strategy"], r["gpus"]] + ([r.get("nccl_channels") or "NCCL's"] if len(header) > 2 else [])
                    + (cells if o["device_kernels"] else ["no device kernels in the trace", "", "", "", "", ""]))
    return markdown_table(header + ["NCCL ms/step", "overlapped", "exposed", "compute", "device idle",
                                    "overlapped by compute stream"], rows)


# ---------------------------------------------------------------- NCCL overlap, from a Chrome trace

NCCL_KERNEL = re.compile(r"^nccl", re.IGNORECASE)
"""NCCL's kernels (ncclKernel_*, ncclDevKernel_*): every other device kernel is compute."""
DEVICE_CATEGORIES = ("kernel",)
"""The trace's device kernels (Kineto's category); copies and memsets (gpu_memcpy, gpu_memset) are neither."""


def merged(intervals: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """(start, end) intervals -> their union as sorted, disjoint intervals."""
    union: List[List[float]] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        else:
            union.append([start, end])
    return [(start, end) for start, end in union]


def covered(union: List[Tuple[float, float]]) -> float:
    return sum(end - start for start, end in union)


def intersection(first: List[Tuple[float, float]], second: List[Tuple[float, float]]) -> float:
    """The length both unions (sorted, disjoint: merged's) cover."""
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        total += max(0.0, min(first[i][1], second[j][1]) - max(first[i][0], second[j][0]))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total


def device_kernels(trace_path: Path) -> List[dict]:
    """One rank's Chrome trace -> its device's kernels (Kineto's `kernel` events, by `args.device` else pid)."""
    by_device: Dict[int, List[dict]] = {}
    for event in json.loads(Path(trace_path).read_text()).get("traceEvents", []):
        if event.get("ph") == "X" and event.get("cat") in DEVICE_CATEGORIES and event.get("dur", 0) > 0:
            by_device.setdefault(int(event.get("args", {}).get("device", event.get("pid"))), []).append(event)
    if len(by_device) > 1:
        raise ValueError(f"{trace_path}: kernels of devices {sorted(by_device)}; one rank's trace has one device's")
    return next(iter(by_device.values()), [])


def span(event: dict) -> Tuple[float, float]:
    """A trace event's (start, end), in the trace's microseconds."""
    return float(event["ts"]), float(event["ts"]) + float(event["dur"])


def unions_by(events: List[dict], key) -> Dict[str, List[Tuple[float, float]]]:
    """{key(event): the union of those events' spans}, keys sorted."""
    groups: Dict[str, List[Tuple[float, float]]] = {}
    for event in events:
        groups.setdefault(str(key(event)), []).append(span(event))
    return {name: merged(spans) for name, spans in sorted(groups.items())}


def nccl_overlap(trace_path: Path, steps: int) -> dict:
    """One rank's Chrome trace (torch.profiler's export_chrome_trace) -> per step (ms over the trace's `steps`), on
    its device: NCCL's kernels' time (the union of their intervals), the part of it during which a compute kernel
    also ran (overlapped: hidden, though it shares the SMs) and the part during which none did (exposed: the
    step waits for it); compute's time, the device's idle time between its first and last kernel, NCCL's time
    by collective, and by compute stream the stream's busy time (a side stream's forward slowed by sharing the
    SMs with NCCL takes longer than at one GPU) and the part of NCCL's time it overlapped (streams overlap each
    other, so these may sum to more than `overlapped_ms`)."""
    events = device_kernels(trace_path)
    nccl_events = [event for event in events if NCCL_KERNEL.match(event["name"])]
    compute_events = [event for event in events if not NCCL_KERNEL.match(event["name"])]
    nccl, compute = merged([span(e) for e in nccl_events]), merged([span(e) for e in compute_events])
    busy = merged(nccl + compute)
    streams = unions_by(compute_events, lambda event: event.get("args", {}).get("stream", event.get("tid")))
    ms = lambda us: us * 1e-3 / max(steps, 1)  # noqa: E731 (microseconds over the trace -> ms a step)
    overlapped = intersection(nccl, compute)
    idle = busy[-1][1] - busy[0][0] - covered(busy) if busy else 0.0
    return {"trace": str(trace_path), "steps": steps, "device_kernels": len(events), "nccl_kernels": len(nccl_events),
            "nccl_ms": ms(covered(nccl)), "overlapped_ms": ms(overlapped), "exposed_ms": ms(covered(nccl) - overlapped),
            "compute_ms": ms(covered(compute)), "idle_ms": ms(idle),
            "nccl_ms_by_collective": {name: ms(covered(union)) for name, union in
                                      unions_by(nccl_events, lambda event: collective(event["name"])).items()},
            "compute_ms_by_stream": {stream: ms(covered(union)) for stream, union in streams.items()},
            "overlapped_ms_by_stream": {stream: ms(intersection(nccl, union)) for stream, union in streams.items()
                                        if intersection(nccl, union) > 0}}


def collective(kernel_name: str) -> str:
    """ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(...) -> ReduceScatter; ncclKernel_AllGather_... -> AllGather."""
    match = re.match(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", kernel_name)
    return match.group(1) if match else kernel_name.split("(")[0]


def overlap_main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="NCCL time overlapped with compute vs exposed, from one rank's "
                                                 "Chrome trace (tools/profile_train.py --trace)")
    parser.add_argument("trace", type=Path)
    parser.add_argument("--steps", type=int, default=1, help="steps the trace covers (its times are divided by it)")
    parser.add_argument("--out", type=Path, help="a .json file or a directory for nccl_overlap.json")
    args = parser.parse_args(argv)
    report = nccl_overlap(args.trace, args.steps)
    print(json.dumps(report, indent=1))
    if args.out:
        write_report(args.out, report, "nccl_overlap")
    return report


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="EAGLE-3 training tokens/s and scaling efficiency at 1, 2, 4 GPUs")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="llama8b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpus", default=None, help="GPU (process) counts, e.g. 1,2 (default 1,2 and 4 if present)")
    parser.add_argument("--strategies", nargs="+", default=None,
                        help="comma- or space-separated; default: deepspeed_stage_2,deepspeed_stage_3 on cuda, ddp "
                             "on cpu; deepspeed_stage_3:shard partitions the target")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after warm-up")
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed (the first compiles)")
    parser.add_argument("--rows", type=int, default=64, help="synthetic rows (cycled)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per configuration (one process)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="profile the last STEPS timed steps of every rank (tools/profile_train.py): op tables "
                             "in each run's logs and profile_train*.json; the profiler's overhead is in the rates")
    parser.add_argument("--trace", action="store_true",
                        help="with --profile: each rank's Chrome trace too, and rank 0's NCCL overlap read from it")
    parser.add_argument("--nccl-channels", default="", metavar="C,C",
                        help="beside every multi-GPU configuration, one run per value with NCCL_MAX_NCHANNELS=C "
                             "(fewer SMs for NCCL's kernels, less bandwidth)")
    parser.add_argument("--phases", action="store_true",
                        help="no profiler: every rank's host time per phase of each timed step (forward, backward, "
                             "optimizer step), in each run's profile_train*.json; the rates are those of plain runs "
                             "plus a host canary timed before each step (about 1 ms)")
    parser.add_argument("--blocking-sync", action="store_true",
                        help="with --phases: each rank's host sleeps instead of spinning while it waits for its GPU")
    parser.add_argument("--pin-cores", action="store_true",
                        help="with --phases: each rank's threads on a disjoint share of the physical cores")
    parser.add_argument("--split-forward", action="store_true",
                        help="with --phases: the forward timed as `target` and `draft`, the device synchronized "
                             "between them (slower steps; shows which part the host limits)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every configuration (repeatable), e.g. "
                             "train.deepspeed.zero_optimization.reduce_bucket_size=500000000")
    parser.add_argument("--out", type=Path, required=True, help="a directory: OUT/scale.json, OUT/logs, OUT/work")
    args = parser.parse_args(argv)
    if not 0 <= args.profile <= args.steps:
        parser.error(f"--profile {args.profile}: between 0 and --steps ({args.steps})")
    if args.trace and not args.profile:
        parser.error("--trace needs --profile STEPS")
    for flag in ("blocking_sync", "pin_cores", "split_forward"):
        if getattr(args, flag) and not args.phases:
            parser.error(f"--{flag.replace('_', '-')} is an experiment of --phases runs: add --phases")
    if args.phases and args.profile:
        parser.error("--phases times phases without the profiler: not with --profile")
    if args.gpus is None:
        import torch

        present = torch.cuda.device_count() if args.device == "cuda" else 2
        args.gpus = ",".join(str(n) for n in (1, 2, 4) if n <= max(present, 1))
    args.gpus = [int(n) for n in args.gpus.split(",")]
    default = "deepspeed_stage_2,deepspeed_stage_3" if args.device == "cuda" else "ddp"
    args.strategies = [name for value in (args.strategies or [default]) for name in value.split(",") if name]
    try:
        args.nccl_channels = [int(value) for value in args.nccl_channels.split(",") if value]
    except ValueError:
        parser.error(f"--nccl-channels {args.nccl_channels}: channel counts, e.g. 4,8")
    if any(value < 1 for value in args.nccl_channels):
        parser.error(f"--nccl-channels {args.nccl_channels}: each at least 1")
    return args


def micro_batch(recipe: Path, strategy: str, overrides: list) -> int:
    """Rows per GPU per step, as `specdraft train` resolves the recipe and the overrides under `strategy` (an
    override of train.deepspeed needs a DeepSpeed one)."""
    from specdraft.recipes import load_recipe

    return load_recipe(recipe, [f"train.strategy={strategy}", *overrides]).train.micro_batch_size


def train_main(argv=None) -> dict:
    args = parse_args(argv)
    spec = CONFIGS[args.config]
    work = args.out / "work"
    write_target(work / "target", spec["target"])
    write_rows(work / "data", args.rows, spec["seq_len"], spec["target"]["vocab_size"])
    args.recipe = write_recipe(work, spec, "bfloat16" if args.device == "cuda" else "float32")
    rows_per_gpu = micro_batch(args.recipe, args.strategies[0], args.override)
    report = {"config": args.config, "device": args.device, "machine": machine(args.device),
              "seq_len": spec["seq_len"], "micro_batch_per_gpu": rows_per_gpu,
              "overrides": args.override, "warmup_steps": args.warmup, "timed_steps": args.steps,
              "profiled_steps": args.profile, "environment": MULTICAST_OFF, "target": spec["target"], "results": []}
    for strategy, gpus, channels in configurations(args):
        report["results"].append(run_one(work, strategy, gpus, args, channels))
        add_efficiency(report["results"])
        write_report(args.out, report, "scale")
    return finish(table(report["results"]), args.out, report, "scale")


def cli_main(argv) -> dict:
    return train_cli.main(argv)


def main(argv=None) -> dict:
    return run_parts({"train": train_main, "zero3-host": scale_host.zero3_host_main,
                      "target-linear": scale_host.target_linear_main, "overlap": overlap_main,
                      "cli": cli_main}, argv)


if __name__ == "__main__":
    main()
