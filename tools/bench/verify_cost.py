"""Verification-cost suite: one verify pass of N tree tokens over a cached context, on a target of a real geometry
with random weights (the time does not depend on the values), ms per N. Pruning a draft tree (C2T) saves verified
tokens; this table turns that saving into time on a large target: a measured projection, not a guess.

    python -m tools.bench.verify_cost --config llama3-8b --context 1024 --nodes 1 8 16 24 32 40 48 56 64 --out OUT
    python -m tools.bench.verify_cost --config smollm2 qwen2.5-coder-1.5b llama3-8b --context 1024 \
        --nodes $(seq 1 64) --out OUT                # several geometries: their curves side by side, one table

Per N: the target's pass over N tree nodes at cache slots C..C+N-1 (C = --context; tree attention over the
context and each node's ancestors, a random tree of N nodes) and the logits of every node, as
`SpecEngine.verify_forward` runs it: on a GPU captured in one CUDA graph and replayed --repeats times after a
warm-up, timed by CUDA events, the median of --rounds rounds. N = 1 is a plain decoding step. The table gives ms a
pass, the pass over a plain step, and the ms saved against --reference N (default 40, the default tree's budget)
per token fewer. bf16 on a GPU (--dtype float32: the dtype the lossless checks and the judge suite decode in); on a
CPU it runs eagerly in float32 (a check that it works, not a measurement).

With --matmuls, per N also the pass's matmuls alone (every layer's qkv, o, gate/up and down, and the LM head, at N
rows, one graph) and the same matmuls split along their inner dimension into S chunks for each --split-k S (one
batched matmul of the S partial products and their sum): where the matmuls alone make up the pass, they set its
cost; where a split is faster, the matmul kernel has too few output tiles to fill the GPU at N rows (float32 has no
tensor-core kernel without TF32, so each tile costs an SM many times what it costs in bf16; --allow-tf32 shows what
tensor cores would change, at TF32's rounding, which the runtime never uses).

    python -m tools.bench.verify_cost --config smollm2 --context 128 --dtype float32 --nodes 1 8 16 40 \\
        --matmuls --split-k 2 4 8 16 --out OUT
OUT/verify_cost.json.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List, Optional, Tuple

from tools.bench.suite import finish, fmt, machine, markdown_table

import torch

GEOMETRIES = {  # TargetInfo fields of each geometry
    "llama3-8b": {"hidden_size": 4096, "num_layers": 32, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                  "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0},
    "smollm2": {"hidden_size": 576, "num_layers": 30, "num_heads": 9, "num_kv_heads": 3, "head_dim": 64,
                "intermediate_size": 1536, "vocab_size": 49152, "rope_theta": 100000.0},
    "qwen2.5-coder-1.5b": {"hidden_size": 1536, "num_layers": 28, "num_heads": 12, "num_kv_heads": 2, "head_dim": 128,
                           "intermediate_size": 8960, "vocab_size": 151936, "rope_theta": 1000000.0},
    "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
             "intermediate_size": 128, "vocab_size": 320, "rope_theta": 10000.0},
    "tiny-qwen2": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                   "intermediate_size": 128, "vocab_size": 320, "rope_theta": 10000.0},
}
QKV_BIAS = ("qwen2.5-coder-1.5b", "tiny-qwen2")
"""The geometries of Qwen2 targets: biases on q, k and v (one more add in each layer's qkv matmul)."""


def random_target(config: str, max_len: int, device: torch.device, dtype: torch.dtype):
    """The runtime's VerifierModel of `config`'s geometry, random weights built in `dtype` on `device`, its static
    cache allocated for `max_len` slots (rotary tables of its rope_theta)."""
    from specdraft.core.types import TargetInfo
    from specdraft.decoding.verifier import VerifierModel

    geometry, qkv_bias = GEOMETRIES[config], config in QKV_BIAS
    info = TargetInfo(name_or_path=f"random {config}", model_type="qwen2" if qkv_bias else "llama",
                      rms_norm_eps=1e-5, max_position_embeddings=max_len, **geometry)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in place in dtype: an 8B target never exists in float32
    try:
        with torch.device(device):
            model = VerifierModel(info, qkv_bias).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(default)
    half = info.head_dim // 2
    inv_freq = info.rope_theta ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.arange(max_len, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [S, D/2]
    angles = torch.cat([angles, angles], dim=-1)  # [S, D]
    model.allocate(max_len, angles.cos(), angles.sin())
    return model


def random_tree(nodes: int, generator: torch.Generator):
    """A random tree of `nodes` nodes (node 0 the root, each node's parent an earlier node) -> (depths [N],
    tree_mask [N, N] bool: a node sees itself and its ancestors)."""
    from specdraft.kernels.tree_select import ancestry

    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, nodes)])
    reach = ancestry(parents, nodes)  # [N, N]
    return reach.sum(1) - 1, reach


def verify_pass_ms(model, context: int, nodes: int, repeats: int, rounds: int) -> float:
    """The median over `rounds` of the mean ms of one verify pass of `nodes` tree tokens after `context` cached
    ones (graphed on a GPU)."""
    from specdraft.decoding.graphs import CallGraph

    device = model.lm_head_weight.device
    generator = torch.Generator().manual_seed(nodes)
    depths, mask = random_tree(nodes, generator)
    tokens = torch.randint(0, model.info.vocab_size, (nodes,), generator=generator).to(device)
    prefix_len = torch.full((1,), context, dtype=torch.long, device=device)
    positions, mask = (prefix_len + depths.to(device)), mask.to(device)

    def verify(tokens, positions, mask):
        hidden, _ = model.run_layers(model.embed(tokens), positions, prefix_len, mask)
        return model.logits(hidden)

    run = verify
    if device.type == "cuda":
        run = CallGraph(verify, [model.k_cache, model.v_cache], example=(tokens, positions, mask))
    with torch.no_grad():
        run(tokens, positions, mask)  # the capture, untimed
        return statistics.median(_timed_mean(run, (tokens, positions, mask), repeats, device) for _ in range(rounds))


def _timed_mean(run, args, repeats: int, device: torch.device) -> float:
    if device.type != "cuda":
        started = time.perf_counter()
        for _ in range(repeats):
            run(*args)
        return 1000 * (time.perf_counter() - started) / repeats
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(repeats):
        run(*args)
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / repeats


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """x [N, K] @ weight [O, K].T as `splits` partial products over chunks of K (one batched matmul, no copies)
    summed -> [N, O]; K must divide into them."""
    rows, inner = x.shape
    chunk = inner // splits
    partial = torch.bmm(x.view(rows, splits, chunk).transpose(0, 1),  # [S, N, K/S]
                        weight.view(-1, splits, chunk).permute(1, 2, 0))  # [S, K/S, O] -> [S, N, O]
    return partial.sum(0)


def pass_weights(model) -> List[torch.Tensor]:
    """The weights [O, K] a verify pass multiplies by, in its order: each layer's qkv, o, gate/up, down, then the
    LM head (a float target's: a quantized one's run other kernels)."""
    weights = [w for layer in model.layers for w in (layer.wqkv.weight, layer.wo.weight, layer.w13.weight,
                                                      layer.w2.weight)]
    return weights + [model.lm_head_weight]


def matmuls_ms(model, nodes: int, splits: int, repeats: int, rounds: int) -> Optional[float]:
    """The pass's matmuls alone at `nodes` rows (`splits` > 1: each split along K, `split_k_linear`), graphed on a
    GPU -> the median over `rounds` of the mean ms; None when a weight's K does not divide into `splits`."""
    from specdraft.decoding.graphs import CallGraph

    weights = pass_weights(model)
    if any(w.shape[1] % splits for w in weights):
        return None
    device = weights[0].device
    inputs = {k: torch.randn(nodes, k, device=device, dtype=weights[0].dtype) for k in {w.shape[1] for w in weights}}

    def matmuls():
        if splits == 1:
            return [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights]
        return [split_k_linear(inputs[w.shape[1]], w, splits) for w in weights]

    run = CallGraph(matmuls, []) if device.type == "cuda" else matmuls
    with torch.no_grad():
        run()
        return statistics.median(_timed_mean(run, (), repeats, device) for _ in range(rounds))


def matmul_gflop(model, nodes: int) -> float:
    """GFLOP of the pass's matmuls at `nodes` rows (2 N K O summed over `pass_weights`)."""
    return 2 * nodes * sum(w.shape[0] * w.shape[1] for w in pass_weights(model)) / 1e9


def matmul_table(rows: List[Dict], splits: List[int]) -> str:
    """Per N: the whole pass, its matmuls alone (and the rate they reach), and the matmuls split along K (module
    docstring)."""
    lines = [[row["nodes"], f"{row['ms']:.3f}", fmt(row["matmuls_ms"], ".3f"),
              fmt(row["matmul_gflop"] / row["matmuls_ms"], ".2f"),
              *(fmt(row["split_k_ms"].get(str(s)), ".3f") for s in splits)] for row in rows]
    return markdown_table(["N (tree tokens)", "ms a verify", "matmuls alone (ms)", "matmul TFLOP/s",
                           *(f"split K in {s} (ms)" for s in splits)], lines)


def cost_table(rows: List[Dict], reference: int) -> str:
    plain = next((row["ms"] for row in rows if row["nodes"] == 1), None)
    base = next((row for row in rows if row["nodes"] == reference), None)
    lines = []
    for row in rows:
        saved = None if base is None or row["nodes"] == reference else \
            (base["ms"] - row["ms"]) / (reference - row["nodes"])
        lines.append([row["nodes"], f"{row['ms']:.3f}", "-" if plain is None else f"{row['ms'] / plain:.2f}",
                      "-" if base is None else f"{row['ms'] / base['ms']:.3f}",
                      "-" if saved is None else f"{1000 * saved:.1f}"])
    return markdown_table(["N (tree tokens)", "ms a verify", "× plain step (N=1)", f"× N={reference}",
                           f"µs a token against N={reference}"], lines)


def curves_table(reports: List[Dict]) -> str:
    """Several geometries' verify cost side by side: per N, each one's ms a verify and that over its own N = 1."""
    nodes = sorted({row["nodes"] for report in reports for row in report["rows"]})
    header = ["N (tree tokens)"] + [f"{report['config']} {what}" for report in reports for what in ("ms", "× N=1")]
    lines = []
    for n in nodes:
        cells = [n]
        for report in reports:
            ms_by_nodes = {row["nodes"]: row["ms"] for row in report["rows"]}
            ms, plain = ms_by_nodes.get(n), ms_by_nodes.get(1)
            cells += [fmt(ms, ".3f"), "-" if ms is None or plain is None else f"{ms / plain:.2f}"]
        lines.append(cells)
    return markdown_table(header, lines)


def timed_rows(model, args) -> List[Dict]:
    """Per N of args.nodes: the pass's ms, and with args.matmuls its matmuls' alone, their GFLOP, and each split's."""
    rows = [{"nodes": n, "ms": verify_pass_ms(model, args.context, n, args.repeats, args.rounds)}
            for n in sorted(set(args.nodes))]
    for row in rows if args.matmuls else []:
        row["matmuls_ms"] = matmuls_ms(model, row["nodes"], 1, args.repeats, args.rounds)
        row["matmul_gflop"] = matmul_gflop(model, row["nodes"])
        row["split_k_ms"] = {str(s): matmuls_ms(model, row["nodes"], s, args.repeats, args.rounds)
                             for s in args.split_k}
    return rows


def config_report(config: str, args, device: torch.device, dtype: torch.dtype) -> Tuple[Dict, str]:
    """One geometry timed (a random target of it built, timed, then freed) -> (its report, its table)."""
    model = random_target(config, args.context + max(args.nodes), device, dtype)
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, args.allow_tf32
    try:
        rows = timed_rows(model, args)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the next geometry's weights in its place
    report = {"config": config, "geometry": GEOMETRIES[config], "qkv_bias": config in QKV_BIAS,
              "context": args.context, "dtype": str(dtype).replace("torch.", ""), "allow_tf32": args.allow_tf32,
              "cuda_graphs": device.type == "cuda",
              "machine": machine(args.device), "repeats": args.repeats, "rounds": args.rounds,
              "reference": args.reference, "rows": rows}
    table = cost_table(rows, args.reference)
    if args.matmuls:
        table += "\n\n" + matmul_table(rows, args.split_k)
    return report, table


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="one verify pass of N tree tokens on a random target, ms per N")
    parser.add_argument("--config", nargs="+", default=["llama3-8b"], choices=sorted(GEOMETRIES),
                        help="the geometries (several: their curves side by side, then each one's table)")
    parser.add_argument("--context", type=int, default=1024, help="cached tokens before the tree")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 8, 16, 24, 32, 40, 48, 56, 64])
    parser.add_argument("--reference", type=int, default=40, help="the N the savings are taken against")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"),
                        help="the target's dtype (auto: bfloat16 on a GPU, float32 on a CPU)")
    parser.add_argument("--allow-tf32", action="store_true",
                        help="float32 matmuls on TF32 tensor cores (rounded: not how the runtime decodes; shows "
                             "what tensor cores would change)")
    parser.add_argument("--matmuls", action="store_true", help="also time the pass's matmuls alone, per N")
    parser.add_argument("--split-k", type=int, nargs="*", default=[], metavar="S",
                        help="with --matmuls, also each matmul split along K into S chunks")
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.nodes):
        parser.error(f"--nodes must be >= 1, got {args.nodes}")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else \
        torch.bfloat16 if device.type == "cuda" else torch.float32
    configs = list(dict.fromkeys(args.config))
    timed = [config_report(config, args, device, dtype) for config in configs]
    if len(timed) == 1:
        return finish(timed[0][1], args.out, timed[0][0], "verify_cost")
    reports = [report for report, _ in timed]
    table = "\n\n".join([curves_table(reports), *(f"{report['config']}:\n\n{own}" for report, own in timed)])
    combined = {"configs": reports, "context": args.context, "dtype": str(dtype).replace("torch.", ""),
                "machine": machine(args.device)}
    return finish(table, args.out, combined, "verify_cost")


if __name__ == "__main__":
    main()
