"""Feature cache suite: what `data.features=hybrid` (and offline) cost per batch on this machine: writing a
batch's target features to the cache, and reading a batch back, at a target's hidden size. Compare the two rates with the online step's
target forward: caching pays only when reading a batch is faster than computing its features.

    python -m tools.bench.feature_cache --hidden 576 --names 4 --rows 32 --tokens 266 --pad-to 1024 --out runs/bench

The features are random bf16 tensors made on the GPU when there is one (as the online target's are), copied to
the host and written with the same code as the hybrid cache (`write_feature_file`); reads go through
`FeatureStore` and `stack_features`, then to the device. The cache lies under --dir (default: a temporary
directory beside --out, on the disk a run's output_dir would use). Writes OUT/feature_cache.json.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tools.bench.suite import finish, machine, markdown_table

import torch

from specdraft.data.features import FeatureStore, write_feature_file


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write_batches(directory: Path, names, args, device: torch.device) -> list:
    """Writes --batches files of --rows rows; -> (ms copying to the host, ms writing the file) per batch."""
    times = []
    for b in range(args.batches):
        features = {name: torch.randn(args.rows, args.tokens, args.hidden, device=device, dtype=torch.bfloat16)
                    for name in names}  # [B, T, H] each
        synchronize(device)
        start = time.perf_counter()
        rows = [{name: features[name][r].cpu() for name in names} for r in range(args.rows)]  # [T, H] each
        copied = time.perf_counter()
        write_feature_file(directory / f"cache-{b}.safetensors", list(range(b * args.rows, (b + 1) * args.rows)), rows)
        times.append(((copied - start) * 1e3, (time.perf_counter() - copied) * 1e3))
    return times


def read_batches(directory: Path, names, args, device: torch.device, pin: bool) -> list:
    """Reads --batches batches of --rows random rows back onto the device; -> (ms reading and stacking, ms
    pinning, ms copying to the device) per batch."""
    from specdraft.train.features import stack_features

    store = FeatureStore(directory, names)
    if len(store) != args.batches * args.rows:
        raise RuntimeError(f"the cache holds {len(store)} rows, {args.batches * args.rows} were written")
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(args.batches):
        row_ids = torch.randperm(len(store), generator=generator)[:args.rows].tolist()
        start = time.perf_counter()
        batch = {"input_ids": torch.zeros(args.rows, max(args.pad_to, args.tokens), dtype=torch.long)}
        stacked = stack_features([store.read(row) for row in row_ids], batch)  # {name: [B, T, H]}
        stacked_at = time.perf_counter()
        if pin:  # as the DataLoader does with pin_memory=True (train/data.py, on CUDA machines)
            stacked = {name: tensor.pin_memory() for name, tensor in stacked.items()}
        pinned_at = time.perf_counter()
        on_device = [tensor.to(device, non_blocking=pin) for tensor in stacked.values()]
        synchronize(device)
        end = time.perf_counter()
        times.append(((stacked_at - start) * 1e3, (pinned_at - stacked_at) * 1e3, (end - pinned_at) * 1e3))
        del on_device
    return times


PARTS = {"write": ("to host", "file"), "read": ("read+stack", "pin", "to device"),
         "read_pinned": ("read+stack", "pin", "to device")}


def summarize(label: str, times: list, batch_mb: float, tokens: int) -> dict:
    """Median ms of each part of a batch and of the whole, with the rates the whole gives."""
    totals = [sum(parts) for parts in times]
    median = statistics.median(totals)
    parts = {name: statistics.median(t[k] for t in times) for k, name in enumerate(PARTS[label])}
    return {"op": label, "ms": median, "parts_ms": parts, "mb_per_s": batch_mb / (median / 1e3),
            "tokens_per_s": tokens / (median / 1e3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="ms a batch to write and to read the hybrid feature cache")
    parser.add_argument("--hidden", type=int, default=576, help="the target's hidden size (SmolLM2-135M: 576)")
    parser.add_argument("--names", type=int, default=4, help="tensors stored per token (EAGLE-3: 3 layers + final)")
    parser.add_argument("--rows", type=int, default=32, help="rows per batch (train.micro_batch_size)")
    parser.add_argument("--tokens", type=int, default=266, help="tokens per row")
    parser.add_argument("--pad-to", type=int, default=1024,
                        help="tokens a read batch is padded to (a batch's longest row; data.max_length at most)")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--dir", type=Path, default=None, help="where the cache is written (default: beside --out)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="feature_cache_", dir=args.dir or args.out.parent))
    names = [f"t{k}" for k in range(args.names)]
    try:
        phases = {"write": write_batches(directory, names, args, device),
                  "read": read_batches(directory, names, args, device, pin=False)}
        if device.type == "cuda":
            phases["read_pinned"] = read_batches(directory, names, args, device, pin=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    batch_mb = args.rows * args.tokens * args.hidden * args.names * 2 / 1e6
    report = {"device": device.type, "machine": machine(device.type),
              "cache_dir": str(directory), "args": {k: str(v) for k, v in vars(args).items()},
              "batch_mb": batch_mb, "phase_ms_each": phases}
    report["rows"] = [summarize(label, times, batch_mb, args.rows * args.tokens) for label, times in phases.items()]
    rows = [[row["op"], f"{batch_mb:.1f}", f"{row['ms']:.1f}", f"{row['mb_per_s']:,.0f}", f"{row['tokens_per_s']:,.0f}",
             ", ".join(f"{part} {ms:.1f}" for part, ms in row["parts_ms"].items())] for row in report["rows"]]
    finish(markdown_table(["op", "MB a batch", "ms a batch", "MB/s", "tokens/s", "parts (ms)"], rows), args.out,
           report, "feature_cache")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
