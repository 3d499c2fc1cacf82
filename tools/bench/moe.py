"""MoE suite: a mixture-of-experts target's routed experts (`kernels.grouped_experts`) and one MoE decoder layer's
whole step, at a real MoE target's shapes with random weights (the time does not depend on the values), per row
count N: a decoding step (N = 1) and verifies of N tree nodes, each against the memory bandwidth that the bytes it
must read need. A verify's rows route to many more experts than one token's, so its bytes grow with N far faster
than on a dense target: the curve says which tree sizes still pay on this target.

    python -m tools.bench.moe --out OUT                               # Qwen3-30B-A3B shapes, one GPU
    python -m tools.bench.moe --config mixtral-8x7b --out OUT
    python -m tools.bench.moe --config tiny --device cpu --out OUT    # the code path on a CPU (no figures)

experts: grouped_experts alone on N rows, for two routings: `random` (each row's k experts drawn uniformly,
distinct within a row) and `skewed` (every row's k drawn from one pool of 2k experts, as a tree's siblings often
share experts). Must-read bytes: the distinct experts the routing touches (their gate/up and down weights) and the
rows in and out. A CUDA graph replay runs --calls launches, each on rows and a routing of its own (no launch finds
the previous one's experts in L2); the time is the median over --reps replays, per launch (CUDA events). The
output is checked against the reference in float32 on the way. --sweep (the default on a GPU) also times every
launch config of SWEEP on the same inputs: which tiles suit which N.

layer: one decoder layer's step at N rows after --context cached tokens, as the runtime's MoE layer runs it:
add + RMSNorm, the qkv projection, (Qwen3) q/k RMSNorm, rotary + the KV-cache write, tree attention over the cache
and a random tree's ancestors, the o projection, add + RMSNorm, the router (softmax, top-k, renormalised where
norm_topk_prob) and the grouped experts, whose output the next layer's first norm adds.
The layer is the runtime's own (the verifier's `DecoderLayer` of a Qwen3-MoE-style `Architecture`). Rows
are random (`random`) or one row plus --skew times noise each (`siblings`: similar rows, which the router sends to
shared experts); the experts they touched are read back from an eager run of the same inputs. Must-read bytes: the
attention, norm and router weights, the KV cache up to the tree's last slot, the touched experts, the rows in and
out. --layers distinct layers take turns, so a layer's weights are never still in L2 from its previous step.
`model ms` projects a whole target's step, num_layers × the layer + its LM head (timed here at N rows); `× decode`
is that over N = 1's: what a verify of N costs against a plain decoding step, the acceptance a tree of N must
beat to pay (drafting aside).

Bandwidth: must-read bytes over the time, and its share of the device-to-device copy bandwidth measured in the same
run (a --copy-mib copy: read + write bytes over its time), the ceiling. On a CPU every step runs eagerly through the
dispatched ops: a check that the suite runs. Writes OUT/moe.json.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from tools.bench.suite import finish, fmt, machine, markdown_table, write_report
from tools.bench.verify_cost import random_tree

import torch
import torch.nn.functional as F

GEOMETRIES = {  # the Hugging Face configs' values
    "qwen3-30b-a3b": dict(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8,
                          inter=768, vocab=151936, norm_topk_prob=True, qk_norm=True, rope_theta=1e6, eps=1e-6),
    "mixtral-8x7b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, experts=8, top_k=2,
                         inter=14336, vocab=32000, norm_topk_prob=True, qk_norm=False, rope_theta=1e6, eps=1e-5),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2, inter=48, vocab=320,
                 norm_topk_prob=True, qk_norm=True, rope_theta=1e4, eps=1e-6),
}
SWEEP = [  # (block_m, gate_up_n, down_n, block_k, warps, stages): launch_config's default among them
    (16, 32, 64, 128, 4, 4), (16, 16, 32, 128, 4, 4), (16, 64, 64, 128, 4, 3), (16, 32, 128, 64, 4, 4),
    (16, 32, 64, 256, 8, 3), (32, 32, 64, 128, 4, 4), (64, 64, 64, 64, 4, 3),
]
MATCH_TOLERANCE = 2e-2  # bfloat16 against the reference in float32


def launch_us(calls: Sequence[Callable[[], object]], reps: int, device: torch.device) -> float:
    """Median µs per call: on a GPU the calls captured in order in one CUDA graph (after a warm-up off the default
    stream that compiles the kernels), replayed `reps` times between CUDA events; on a CPU each run once eagerly."""
    if device.type != "cuda":
        started = time.perf_counter()
        for call in calls:
            call()
        return 1e6 * (time.perf_counter() - started) / len(calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(1e3 * start.elapsed_time(end) / len(calls))
    return statistics.median(samples)


def copy_gbps(mib: int, reps: int, device: torch.device) -> float:
    """Device-to-device copy bandwidth, GB/s of bytes read + written: the ceiling a bandwidth share is against."""
    source = torch.empty(mib << 20, dtype=torch.uint8, device=device).random_(0, 255)
    target = torch.empty_like(source)
    us = launch_us([lambda: target.copy_(source)] * 4, reps, device)
    return 2 * source.numel() / us / 1e3


def element_bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


def routing(rows: int, num_experts: int, top_k: int, skewed: bool, generator: torch.Generator):
    """expert_ids [N, k] int64 distinct within a row (skewed: all from one random pool of 2k experts) and softmax
    routing weights [N, k] float32."""
    pool = torch.randperm(num_experts, generator=generator)[:min(num_experts, 2 * top_k) if skewed else None]
    picks = torch.rand(rows, pool.numel(), generator=generator).argsort(dim=1)[:, :top_k]
    return pool[picks], torch.softmax(torch.randn(rows, top_k, generator=generator), dim=-1)


def random_experts(geometry: dict, device: torch.device, dtype: torch.dtype):
    """gate_up [E, 2I, H] and down [E, H, I], random, built in place in `dtype`."""
    experts, hidden, inter = geometry["experts"], geometry["hidden"], geometry["inter"]
    gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=dtype).mul_(hidden ** -0.5)
    down = torch.randn(experts, hidden, inter, device=device, dtype=dtype).mul_(inter ** -0.5)
    return gate_up, down


def expert_bytes(geometry: dict, touched: int, elem: int) -> int:
    return touched * 3 * geometry["hidden"] * geometry["inter"] * elem


def touched_experts(expert_ids: torch.Tensor, num_experts: int) -> int:
    return int(torch.unique(expert_ids[(expert_ids >= 0) & (expert_ids < num_experts)]).numel())


@dataclass
class ExpertCase:
    """One routing kind at N rows: --calls launches' inputs, each launch's must-read bytes."""

    hidden: List[torch.Tensor]  # [N, H] each
    expert_ids: List[torch.Tensor]  # [N, k]
    expert_weights: List[torch.Tensor]  # [N, k]
    touched: List[int]
    bytes: List[int]


def expert_case(geometry: dict, rows: int, skewed: bool, calls: int, device, dtype, generator) -> ExpertCase:
    elem = element_bytes(dtype)
    case = ExpertCase([], [], [], [], [])
    for _ in range(calls):
        expert_ids, expert_weights = routing(rows, geometry["experts"], geometry["top_k"], skewed, generator)
        case.hidden.append(torch.randn(rows, geometry["hidden"], generator=generator).to(device, dtype))
        case.expert_ids.append(expert_ids.to(device))
        case.expert_weights.append(expert_weights.to(device))
        case.touched.append(touched_experts(expert_ids, geometry["experts"]))
        case.bytes.append(expert_bytes(geometry, case.touched[-1], elem) + 2 * rows * geometry["hidden"] * elem)
    return case


def expert_calls(case: ExpertCase, gate_up, down, run) -> List[Callable[[], object]]:
    return [lambda i=i: run(case.hidden[i], gate_up, down, case.expert_ids[i], case.expert_weights[i])
            for i in range(len(case.hidden))]


def bandwidth(bytes_: float, us: float, ceiling: float) -> Dict[str, float]:
    gbps = bytes_ / us / 1e3
    return {"us": round(us, 2), "gbps": round(gbps, 1), "pct_of_copy": round(100 * gbps / ceiling, 1)}


def experts_part(geometry, args, device, dtype, ceiling) -> tuple:
    """Part (a): rows of the experts table, and of the launch-config sweep (empty without --sweep)."""
    generator = torch.Generator().manual_seed(0)
    gate_up, down = random_experts(geometry, device, dtype)
    reference_weights = (gate_up.float(), down.float())
    rows, sweep = [], []
    for kind in ("random", "skewed"):
        for nodes in args.nodes:
            case = expert_case(geometry, nodes, kind == "skewed", args.calls, device, dtype, generator)
            rows.append({"routing": kind, "nodes": nodes, "touched_experts": statistics.mean(case.touched),
                         **expert_timing(case, gate_up, down, reference_weights, args.reps, ceiling)})
            sweep += [{"routing": kind, "nodes": nodes, **row}
                      for row in (sweep_rows(case, gate_up, down, args.reps, ceiling) if args.sweep else [])]
            print(f"experts {kind} N={nodes}: {rows[-1]['us']} µs, {rows[-1]['pct_of_copy']}% of copy", flush=True)
    return rows, sweep


def expert_timing(case: ExpertCase, gate_up, down, reference_weights, reps: int, ceiling: float) -> dict:
    """The dispatched grouped_experts on the case: its time, bandwidth, and its first launch's output against the
    reference's in float32."""
    from specdraft.kernels.grouped_experts import grouped_experts, grouped_experts_reference

    got = grouped_experts(case.hidden[0], gate_up, down, case.expert_ids[0], case.expert_weights[0])
    expected = grouped_experts_reference(case.hidden[0].float(), *reference_weights, case.expert_ids[0],
                                         case.expert_weights[0])
    error = float((got.float() - expected).abs().max())
    us = launch_us(expert_calls(case, gate_up, down, grouped_experts), reps, got.device)
    mean_bytes = statistics.mean(case.bytes)
    return {"mb": round(mean_bytes / 1e6, 2), **bandwidth(mean_bytes, us, ceiling), "max_abs_error": error,
            "match": error <= MATCH_TOLERANCE}


def sweep_rows(case: ExpertCase, gate_up, down, reps: int, ceiling: float) -> List[dict]:
    """The Triton kernel on the case under each launch config of SWEEP."""
    from specdraft.kernels.grouped_experts.triton_kernel import LaunchConfig, grouped_experts_triton

    rows = []
    for config in SWEEP:
        forced = LaunchConfig(*config)

        def run(*inputs, forced=forced):
            return grouped_experts_triton(*inputs, config=forced)
        try:
            us = launch_us(expert_calls(case, gate_up, down, run), reps, gate_up.device)
        except Exception as error:  # a config this device cannot run (its shared memory): noted, the sweep goes on
            print(f"  config {config}: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
            rows.append({"config": forced._asdict(), "error": f"{type(error).__name__}: {error}"[:300]})
            continue
        rows.append({"config": forced._asdict(), **bandwidth(statistics.mean(case.bytes), us, ceiling)})
    return rows


@dataclass
class Layer:
    """One MoE decoder layer of the runtime (the verifier's `DecoderLayer`, its routed experts included) and its KV
    cache."""

    module: torch.nn.Module
    k_cache: torch.Tensor  # [Hkv, S, D]
    v_cache: torch.Tensor  # [Hkv, S, D]


def layer_architecture(geometry: dict):
    """(TargetInfo, Architecture) of one MoE layer of the geometry, as its family's description gives it: Qwen3-MoE's
    q/k norms where qk_norm, the router's top k renormalised where norm_topk_prob."""
    from specdraft.core.types import TargetInfo
    from specdraft.decoding.verifier import Architecture, Experts, LayerKind

    info = TargetInfo(name_or_path="random MoE layer", model_type="moe", hidden_size=geometry["hidden"], num_layers=1,
                      num_heads=geometry["heads"], num_kv_heads=geometry["kv_heads"], head_dim=geometry["head_dim"],
                      intermediate_size=geometry["inter"], vocab_size=geometry["vocab"], rms_norm_eps=geometry["eps"],
                      rope_theta=geometry["rope_theta"], max_position_embeddings=4096)
    experts = Experts(geometry["experts"], geometry["top_k"], geometry["inter"], geometry["norm_topk_prob"])
    kind = LayerKind(geometry["inter"], experts=experts)
    return info, Architecture(layers=(kind,), qk_norm=geometry["qk_norm"])


def random_layer(geometry: dict, max_len: int, device, dtype) -> Layer:
    """The runtime's layer with random weights (norms 1) and a random KV cache, built in place in `dtype`."""
    from specdraft.decoding.verifier import DecoderLayer

    info, architecture = layer_architecture(geometry)
    with torch.device("meta"):
        module = DecoderLayer(info, architecture, architecture.layers[0]).to(dtype)
    module.to_empty(device=device).eval().requires_grad_(False)
    for param in module.parameters():
        param.fill_(1.0) if param.dim() == 1 else param.normal_().mul_(param.shape[-1] ** -0.5)
    cache = torch.randn(2, geometry["kv_heads"], max_len, geometry["head_dim"], device=device, dtype=dtype)
    return Layer(module, cache[0], cache[1])


def layer_step(layer: Layer, hidden, pending, rope, positions, slots, prefix_len, tree_mask):
    """hidden [N, H] and pending [N, H] (the previous layer's MoE output, added in the first norm's launch, as the
    runtime's layers do) -> (hidden after attention, the MoE output): the runtime's layer forward of a verify."""
    _, attended, out = layer.module(hidden, pending, rope, positions, layer.k_cache, layer.v_cache, slots,
                                    prefix_len, tree_mask, causal_prefill=False)
    return attended, out


def routed_ids(layer: Layer, step: Callable[[], object]) -> torch.Tensor:
    """The expert_ids [N, k] a step's rows route to: the experts' input read by a hook on an eager run of it."""
    from specdraft.decoding.verifier.layer import route

    seen = []
    handle = layer.module.experts.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    try:
        step()
    finally:
        handle.remove()
    experts = layer.module.experts
    return route(F.linear(seen[0], experts.router), experts.top_k, experts.renormalize)[0]


def rope_tables(geometry: dict, max_len: int, device, dtype):
    """cos, sin [S, D] (half-rotation layout) of the geometry's rope_theta."""
    half = geometry["head_dim"] // 2
    inv_freq = geometry["rope_theta"] ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.arange(max_len, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def tree_inputs(nodes: int, context: int, device, generator: torch.Generator):
    """A verify's tree after `context` cached tokens -> (positions [N], slots [N], prefix_len [1], tree_mask
    [N, N]): node i at slot context + i, its position context + its depth."""
    depths, tree_mask = random_tree(nodes, generator)
    prefix_len = torch.full((1,), context, dtype=torch.long, device=device)
    return prefix_len + depths.to(device), prefix_len + torch.arange(nodes, device=device), prefix_len, \
        tree_mask.to(device)


def layer_fixed_bytes(geometry: dict, context: int, nodes: int, elem: int) -> int:
    """A layer step's must-read bytes apart from its experts: attention, norm and router weights, the KV cache
    up to the tree's last slot, the rows in and out."""
    hidden, heads, kv_heads, head_dim = (geometry[key] for key in ("hidden", "heads", "kv_heads", "head_dim"))
    weights = (heads + 2 * kv_heads) * head_dim * hidden + hidden * heads * head_dim + geometry["experts"] * hidden
    norms = 2 * hidden + (2 * head_dim if geometry["qk_norm"] else 0)
    kv_cache = 2 * kv_heads * (context + nodes) * head_dim
    return (weights + norms + kv_cache + 2 * nodes * hidden) * elem


def layer_rows(geometry, args, device, dtype, ceiling) -> List[dict]:
    """Part (b): per row kind and N, the layer step's time, bytes and share of the copy bandwidth, and the whole
    target's projected step."""
    from specdraft.kernels.rms_norm import rms_norm

    generator = torch.Generator().manual_seed(1)
    max_len = args.context + max(args.nodes)
    layers = [random_layer(geometry, max_len, device, dtype) for _ in range(args.layers)]
    rope = rope_tables(geometry, max_len, device, dtype)
    lm_head = torch.randn(geometry["vocab"], geometry["hidden"], device=device, dtype=dtype)
    final_norm = torch.ones(geometry["hidden"], device=device, dtype=dtype)
    elem, rows = element_bytes(dtype), []
    for kind in ("random", "siblings"):
        for nodes in args.nodes:
            tree = tree_inputs(nodes, args.context, device, generator)
            inputs = [layer_input(geometry, nodes, kind, args.skew, generator).to(device, dtype)
                      for _ in range(args.calls)]
            pending = torch.randn(nodes, geometry["hidden"], generator=generator).mul_(0.1).to(device, dtype)
            calls = [lambda i=i: layer_step(layers[i % len(layers)], inputs[i], pending, rope, *tree)
                     for i in range(args.calls)]
            touched = [touched_experts(routed_ids(layers[i % len(layers)], call), geometry["experts"])
                       for i, call in enumerate(calls)]  # eager: read back
            us = launch_us(calls, args.reps, device)
            head_us = launch_us([lambda x=x: F.linear(rms_norm(x, final_norm, geometry["eps"]), lm_head)
                                 for x in inputs[:4]], args.reps, device)
            mean_bytes = layer_fixed_bytes(geometry, args.context, nodes, elem) + \
                statistics.mean(expert_bytes(geometry, t, elem) for t in touched)
            rows.append({"rows": kind, "nodes": nodes, "touched_experts": statistics.mean(touched),
                         "mb": round(mean_bytes / 1e6, 2), **bandwidth(mean_bytes, us, ceiling),
                         "head_us": round(head_us, 2),
                         "model_ms": round((geometry["layers"] * us + head_us) / 1e3, 3)})
            print(f"layer {kind} N={nodes}: {rows[-1]['us']} µs, {rows[-1]['pct_of_copy']}% of copy", flush=True)
    for row in rows:
        decode = next((r["model_ms"] for r in rows if r["rows"] == row["rows"] and r["nodes"] == 1), None)
        row["x_decode"] = None if decode is None else round(row["model_ms"] / decode, 2)
    return rows


def layer_input(geometry: dict, nodes: int, kind: str, skew: float, generator: torch.Generator) -> torch.Tensor:
    """[N, H] rows: random, or (siblings) one random row plus `skew` times noise each."""
    if kind == "random":
        return torch.randn(nodes, geometry["hidden"], generator=generator)
    base = torch.randn(1, geometry["hidden"], generator=generator)
    return base + skew * torch.randn(nodes, geometry["hidden"], generator=generator)


def experts_table(rows: List[dict]) -> str:
    return markdown_table(
        ["routing", "N", "experts touched", "MB must read", "µs a launch", "GB/s", "% of copy", "matches reference"],
        [[r["routing"], r["nodes"], f"{r['touched_experts']:.1f}", f"{r['mb']:.1f}", f"{r['us']:.1f}",
          f"{r['gbps']:.0f}", f"{r['pct_of_copy']:.1f}", r["match"]] for r in rows])


def layer_table(rows: List[dict]) -> str:
    return markdown_table(
        ["rows", "N", "experts touched", "MB must read", "µs a layer step", "GB/s", "% of copy", "model ms",
         "× decode"],
        [[r["rows"], r["nodes"], f"{r['touched_experts']:.1f}", f"{r['mb']:.1f}", f"{r['us']:.1f}",
          f"{r['gbps']:.0f}", f"{r['pct_of_copy']:.1f}", f"{r['model_ms']:.3f}", fmt(r["x_decode"], ".2f")]
         for r in rows])


def sweep_table(sweep: List[dict]) -> str:
    """Per routing and N, the fastest launch config and the default's time."""
    best: Dict[tuple, dict] = {}
    for row in (row for row in sweep if "us" in row):
        key = (row["routing"], row["nodes"])
        if key not in best or row["us"] < best[key]["us"]:
            best[key] = row
    default = {(r["routing"], r["nodes"]): r for r in sweep if tuple(r["config"].values()) == SWEEP[0] and "us" in r}
    return markdown_table(
        ["routing", "N", "fastest config (block_m, gate_up_n, down_n, block_k, warps, stages)", "µs", "% of copy",
         "SWEEP[0] µs"],
        [[k[0], k[1], tuple(r["config"].values()), f"{r['us']:.1f}", f"{r['pct_of_copy']:.1f}",
          fmt(default[k]["us"] if k in default else None, ".1f")] for k, r in best.items()])


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description="grouped experts and an MoE layer's step against the bandwidth "
                                                 "bound of their bytes, per row count")
    parser.add_argument("--config", default="qwen3-30b-a3b", choices=sorted(GEOMETRIES))
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 8, 16, 40, 64])
    parser.add_argument("--parts", nargs="+", default=["experts", "layer"], choices=["experts", "layer"])
    parser.add_argument("--context", type=int, default=1024, help="cached tokens before the tree (layer part)")
    parser.add_argument("--layers", type=int, default=2, help="distinct layers taking turns (layer part)")
    parser.add_argument("--skew", type=float, default=0.25, help="the siblings' noise, relative to their rows")
    parser.add_argument("--calls", type=int, default=16, help="launches a graph replay (each its own inputs)")
    parser.add_argument("--reps", type=int, default=20, help="timed replays (the median is reported)")
    parser.add_argument("--copy-mib", type=int, default=1024, help="the bandwidth ceiling's copy size")
    parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=None,
                        help="also time each launch config of SWEEP (default: on a GPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    if any(n < 1 or n > 64 for n in args.nodes):
        parser.error(f"--nodes must be 1 to 64 (tree attention's window), got {args.nodes}")
    args.nodes = sorted(set(args.nodes))
    device = torch.device(args.device)
    args.sweep = device.type == "cuda" if args.sweep is None else args.sweep
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    geometry = GEOMETRIES[args.config]
    torch.manual_seed(0)
    with torch.no_grad():
        ceiling = copy_gbps(args.copy_mib, args.reps, device)
        print(f"copy bandwidth: {ceiling:.1f} GB/s", flush=True)
        report = {"config": args.config, "geometry": geometry, "dtype": str(dtype).replace("torch.", ""),
                  "machine": machine(args.device), "cuda_graphs": device.type == "cuda",
                  "copy_gbps": round(ceiling, 1), "context": args.context, "calls": args.calls, "reps": args.reps,
                  "experts": [], "sweep": [], "layer": []}
        if "experts" in args.parts:
            report["experts"], report["sweep"] = experts_part(geometry, args, device, dtype, ceiling)
            write_report(args.out, report, "moe")  # kept if the layer part fails
        if "layer" in args.parts:
            report["layer"] = layer_rows(geometry, args, device, dtype, ceiling)
    tables = [f"copy bandwidth {ceiling:.1f} GB/s ({args.copy_mib} MiB, read + write)"]
    tables += [experts_table(report["experts"])] if report["experts"] else []
    tables += [sweep_table(report["sweep"])] if report["sweep"] else []
    tables += [layer_table(report["layer"])] if report["layer"] else []
    return finish("\n\n".join(tables), args.out, report, "moe")


if __name__ == "__main__":
    main()
