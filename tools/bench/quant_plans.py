"""quant_linear's launch plans on the linear layers of a target geometry: for each layer shape and row count, the
default plan (`kernels.quant_linear.triton_kernel.launch_plan`) against every plan of a grid (gemv and dot
programs, output block widths, input splits, warps) and bf16's F.linear (cuBLAS), each call timed inside a CUDA
graph (20 calls a replay, the best of 5 replays: launch costs as the runtime's graphs pay them). The table has
per shape and rows: bf16, the default plan, the best plan and its fields, and the best's share of the weights'
bytes per second; the JSON keeps every plan's time, for setting launch_plan's defaults.

    python -m tools.bench.quant_plans --geometry llama3-8b smollm2 --rows 1 40 --bits 4 --jobs 12 --out OUT

`--jobs N` compiles the grid's kernels in N processes first (Triton caches them on disk), so the timing process
loads them instead of compiling some hundreds one by one.
"""
from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import time
from typing import Dict, List

from tools.bench.quantization import GEOMETRIES
from tools.bench.suite import child_env, finish, fmt, machine, markdown_table

import torch

GEMV_GRID = dict(block_n=(32, 64), splits=(1, 2, 4, 8), warps=(4, 8))
DOT_GRID = dict(block_n=(32, 64, 128), splits=(1, 2, 4, 8), swap=(False, True))
CALLS, REPLAYS = 20, 5


def layer_shapes(geometry: str) -> Dict[str, tuple]:
    """name -> (in_features, out_features) of the runtime target's linear layers (q, k, v and gate, up fused)."""
    g = GEOMETRIES[geometry]
    hidden, heads, kv, dim = g["hidden_size"], g["num_heads"], g["num_kv_heads"], g["head_dim"]
    return {"qkv": (hidden, (heads + 2 * kv) * dim), "o": (heads * dim, hidden),
            "gate_up": (hidden, 2 * g["intermediate_size"]), "down": (g["intermediate_size"], hidden),
            "lm_head": (hidden, g["vocab_size"])}


def random_weight(in_features: int, out_features: int, bits: int, device: torch.device):
    """A QuantizedWeight of random codes and small scales (speed does not depend on the values)."""
    from specdraft.kernels.quant_linear import GROUP_SIZE, QuantizedWeight

    gen = torch.Generator(device=device).manual_seed(0)
    if bits == 8:
        data = torch.randint(-127, 128, (out_features, in_features), generator=gen, device=device, dtype=torch.int8)
        return QuantizedWeight(8, data, torch.full((out_features,), 1e-3, device=device), None, in_features,
                               in_features)
    groups = -(-in_features // GROUP_SIZE)
    data = torch.randint(0, 256, (out_features, -(-in_features // 2)), generator=gen, device=device,
                         dtype=torch.uint8)
    scales = torch.full((out_features, groups), 1e-3, device=device, dtype=torch.float16)
    return QuantizedWeight(4, data, scales, -scales * 8, in_features, GROUP_SIZE)


def plans(rows: int, weight, device: torch.device) -> List:
    """The default plan first, then the grid's (gemv plans only for rows the gemv serves well: up to 4)."""
    from specdraft.kernels.quant_linear.triton_kernel import launch_plan

    found = [launch_plan(rows, weight, device)]
    grids = [(False, DOT_GRID)] + ([(True, GEMV_GRID)] if rows <= 4 else [])
    for gemv, grid in grids:
        for values in itertools.product(*grid.values()):
            plan = launch_plan(rows, weight, device, gemv=gemv, **dict(zip(grid, values)))
            if plan not in found:
                found.append(plan)
    return found


def graph_us(run, device: torch.device) -> float:
    """µs a call of run(), CALLS calls captured in one CUDA graph, the best of REPLAYS replays."""
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(CALLS):
            run()
    best = float("inf")
    for _ in range(REPLAYS):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - started) / CALLS)
    return 1e6 * best


def cases(args) -> List[tuple]:
    return [(geometry, name, shape, rows, bits) for geometry in args.geometry
            for name, shape in layer_shapes(geometry).items() for rows in args.rows for bits in args.bits
            if not args.only or f"{geometry}:{rows}" in args.only]


def time_case(case: tuple, device: torch.device, compile_only: bool) -> dict:
    """Every plan of one (geometry, layer, rows, bits) timed (or only run once, to compile it)."""
    from specdraft.kernels.quant_linear.triton_kernel import quant_linear_triton

    geometry, name, (in_features, out_features), rows, bits = case
    weight = random_weight(in_features, out_features, bits, device)
    x = torch.randn(rows, in_features, device=device, dtype=torch.bfloat16)
    timings = []
    for plan in plans(rows, weight, device):
        if compile_only:
            quant_linear_triton(x, weight, None, plan)
            continue
        timings.append({"plan": plan._asdict(), "us": graph_us(lambda: quant_linear_triton(x, weight, None, plan),
                                                                device)})
    if compile_only:
        return {}
    dense = torch.randn(out_features, in_features, device=device, dtype=torch.bfloat16)
    bf16_us = graph_us(lambda: torch.nn.functional.linear(x, dense), device)
    nbytes = weight.data.numel() * weight.data.element_size() + 4 * weight.scales.numel()
    return {"geometry": geometry, "layer": name, "in": in_features, "out": out_features, "rows": rows, "bits": bits,
            "bf16_us": bf16_us, "bytes": nbytes, "plans": timings}


def precompile(args) -> None:
    """The grid's kernels compiled in --jobs processes, each a share of the cases."""
    argv = [sys.executable, "-m", "tools.bench.quant_plans", "--compile-only", "--geometry", *args.geometry,
            "--rows", *map(str, args.rows), "--bits", *map(str, args.bits), "--only", *args.only]
    workers = [subprocess.Popen([*argv, "--share", f"{i}/{args.jobs}"], env=child_env()) for i in range(args.jobs)]
    if any(worker.wait() != 0 for worker in workers):
        raise SystemExit("a compiling worker failed")


def table(results: List[dict]) -> str:
    rows = []
    for r in results:
        default, best = r["plans"][0], min(r["plans"], key=lambda t: t["us"])
        plan = best["plan"]
        kind = "gemv" if plan["gemv"] else "dot-swap" if plan["swap"] else "dot"
        fields = f"{kind} n{plan['block_n']} s{plan['splits']} w{plan['warps']} st{plan['stages']}"
        rows.append([r["geometry"], r["layer"], f"{r['in']}→{r['out']}", r["rows"], r["bits"], fmt(r["bf16_us"]),
                     fmt(default["us"]), fmt(best["us"]), fields, fmt(r["bytes"] / best["us"] / 1e3, ",.0f"),
                     fmt(r["bf16_us"] / best["us"], ".2f")])
    return markdown_table(["geometry", "layer", "in→out", "rows", "bits", "bf16 µs", "default µs", "best µs",
                           "best plan", "best GB/s", "× bf16"], rows)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="quant_linear's launch plans against bf16, per layer and rows")
    parser.add_argument("--geometry", nargs="+", default=["llama3-8b", "smollm2"], choices=sorted(GEOMETRIES))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 40])
    parser.add_argument("--only", nargs="*", default=[], help="GEOMETRY:ROWS pairs to keep (default: every pair)")
    parser.add_argument("--bits", nargs="+", type=int, default=[4])
    parser.add_argument("--jobs", type=int, default=0, help="processes compiling the grid first (0: none)")
    parser.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--share", default="0/1", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    every = cases(args)
    if args.compile_only:
        index, count = map(int, args.share.split("/"))
        for case in every[index::count]:
            time_case(case, device, compile_only=True)
        return {}
    if args.jobs:
        precompile(args)
    results = [time_case(case, device, compile_only=False) for case in every]
    report = {"machine": machine(), "torch": torch.__version__, "results": results}
    return finish(table(results), args.out, report, "quant_plans")


if __name__ == "__main__":
    main()
