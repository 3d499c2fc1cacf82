"""Where decoding's time goes on a GPU: the device's kernel time against the wall clock, for plain decoding and
for speculative decoding, each as `specdraft bench` runs it (CUDA graphs, one step in flight), traced by the
PyTorch profiler.

A step bound by the device keeps it busy: its kernels' time is near its wall time. A step bound by the host
(issuing graphs, reading tokens back, Python between steps) leaves the device idle for the rest: where a loop
takes more than its launches suggest, this tells which side that time is on. The profiler adds host time of its
own (its CPU events), so read the wall columns beside `specdraft bench`'s rates; the kernel columns are the
device's own.

    python -m tools.trace_decoding EXPORT_DIR --prompts .data/mt_bench.jsonl --tokens 128 --out runs/trace

Prints a table and writes OUT/trace_decoding.json and a Chrome trace per mode (OUT/<mode>_trace.json). On a CPU
there are no device kernels: the kernel columns read n/a.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from specdraft.core.io import write_json


def _kernel_times(profiler) -> Optional[Dict[str, float]]:
    """The device's kernels in a profile -> {kernel_ms: their summed time, span_ms: first start to last end,
    kernels: their count}; None without device kernels."""
    kernels = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return None
    starts = [event.time_range.start for event in kernels]
    ends = [event.time_range.end for event in kernels]
    return {"kernel_ms": sum(e - s for s, e in zip(starts, ends)) / 1000, "span_ms": (max(ends) - min(starts)) / 1000,
            "kernels": len(kernels)}


def trace_mode(engine, mode: str, prompt: List[int], tokens: int, trace_path: Optional[Path] = None) -> dict:
    """Decode `tokens` new tokens of `prompt` (mode: plain or spec) once untimed (a graph's capture), then once
    under the profiler -> its wall time, steps (tokens for plain decoding, cycles for speculative), and the
    device's kernel time, each also per step."""
    from torch.profiler import ProfilerActivity, profile

    run = engine.decode_plain if mode == "plain" else engine.generate
    run(prompt, tokens)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        started = time.perf_counter()
        result = run(prompt, tokens)
        wall_ms = 1000 * (time.perf_counter() - started)
    if trace_path is not None:
        profiler.export_chrome_trace(str(trace_path))
    steps = len(result.accepted) if mode == "spec" else len(result.tokens)
    device = _kernel_times(profiler)
    row = {"mode": mode, "steps": steps, "new_tokens": len(result.tokens), "wall_ms": wall_ms,
           "wall_ms_per_step": wall_ms / max(1, steps), "kernel_ms": None, "kernel_ms_per_step": None,
           "device_busy": None, "kernels_per_step": None}
    if device is not None:
        row.update(kernel_ms=device["kernel_ms"], kernel_ms_per_step=device["kernel_ms"] / max(1, steps),
                   device_busy=device["kernel_ms"] / wall_ms, kernels_per_step=device["kernels"] / max(1, steps))
    return row


def table(rows: List[dict]) -> str:
    fmt = lambda value, places: "n/a" if value is None else f"{value:.{places}f}"  # noqa: E731
    lines = [f"{'mode':>6} {'steps':>6} {'tokens':>7} {'wall ms/step':>13} {'kernel ms/step':>15} {'busy':>6} "
             f"{'kernels/step':>13}"]
    for row in rows:
        lines.append(f"{row['mode']:>6} {row['steps']:>6} {row['new_tokens']:>7} {row['wall_ms_per_step']:>13.3f} "
                     f"{fmt(row['kernel_ms_per_step'], 3):>15} {fmt(row['device_busy'], 2):>6} "
                     f"{fmt(row['kernels_per_step'], 1):>13}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="an export or run directory (`specdraft bench`'s EXPORT_DIR)")
    parser.add_argument("--target", default=None, help="the target's path, if not the one the draft names")
    parser.add_argument("--prompts", default=None, help="prompt file (default: MT-bench's questions); the first")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per mode")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("runs/trace_decoding"))
    args = parser.parse_args(argv)
    from specdraft.runtime.bench import BenchSettings, first_user_turns
    from specdraft.config import RuntimeConfig
    from specdraft.runtime.load import load_runtime

    runtime = load_runtime(args.export, RuntimeConfig(device=args.device), args.target)
    prompt = first_user_turns(runtime, args.prompts or BenchSettings.prompts, 1)[0]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [trace_mode(runtime.engine, mode, prompt, args.tokens, args.out / f"{mode}_trace.json")
            for mode in ("plain", "spec")]
    report = {"export": str(args.export), "tokens": args.tokens, "device": str(runtime.engine.device),
              "cuda_graphs": runtime.engine.use_graphs, "overlap": runtime.engine.overlap, "rows": rows}
    write_json(args.out / "trace_decoding.json", report)
    print(table(rows))
    print(f"-> {args.out / 'trace_decoding.json'}")
    return report


if __name__ == "__main__":
    main()
