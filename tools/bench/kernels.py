"""Kernels suite: each runtime op's Triton kernel against its PyTorch reference at runtime shapes (SmolLM2-135M
and Llama-3-8B, batch 1, bfloat16), checking on the way that both give the same outputs.

On CUDA each implementation is captured in a CUDA graph of `--iters` calls (as the runtime replays it) and timed
with CUDA events over `--reps` replays: the median per call is reported, launch overhead excluded, inputs warm in
L2 (as they are when the runtime has just produced them). Prints a table and writes OUT/kernels.json (or --out
itself, a .json path); exits 1 if any kernel's outputs differ from its reference's.
`draft_topk vs torch.topk` times the kernel against the unfused eager ops (log_softmax, topk, gather), whose
tie order is unspecified: a fairer bar than the reference's stable sort. The decoder-layer ops (`rms_norm`,
`add_rms_norm`, `rope_cache`, `silu_mul`, `draft_input`) are timed against their references, which are the unfused
layer's ops (`rope_cache`'s includes the cos/sin gathers, once per forward before the fusion); their `bitwise` field
says whether the outputs are the same bits (`match` allows one bfloat16 rounding step).

    python -m tools.bench.kernels --out runs/bench                 # CUDA GPU, about a minute (mostly compiling)
    python -m tools.bench.kernels --device cpu --out /tmp/bench     # tiny shapes, the Triton interpreter
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from tools.bench.suite import finish, machine, markdown_table

import torch

MODELS = {
    "smollm2": {"layers": 30, "kv_heads": 3, "q_heads": 9, "head_dim": 64, "vocab": 49152,
                "draft_vocabs": (8192, 32000), "hidden": 576, "intermediate": 1536},
    "llama3": {"layers": 32, "kv_heads": 8, "q_heads": 32, "head_dim": 128, "vocab": 128256,
               "draft_vocabs": (32000,), "hidden": 4096, "intermediate": 14336},
}
TINY = {"tiny": {"layers": 2, "kv_heads": 2, "q_heads": 4, "head_dim": 16, "vocab": 500, "draft_vocabs": (300,),
                 "hidden": 64, "intermediate": 128}}


@dataclass
class Case:
    op: str
    shape: str
    reference: Callable[[], object]
    triton: Callable[[], object]
    check: Callable[[Case], bool]  # both implementations give the same outputs (within tolerance)
    bitwise: Callable[[Case], bool] | None = None  # whether they give the same bits (ops that promise it)


def _binary_tree(num_nodes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [N] (node i's parent is (i - 1) // 2) and the ancestor mask [N, N]."""
    parents = (torch.arange(num_nodes) - 1).div(2, rounding_mode="floor")
    parents[0] = -1
    mask = torch.eye(num_nodes, dtype=torch.bool)
    for node in range(1, num_nodes):
        mask[node] |= mask[int(parents[node])]
    return parents.to(device), mask.to(device)


def _same(check_outputs):
    """A check that runs both implementations once and compares their outputs."""
    return lambda case: check_outputs(case.reference(), case.triton())


def topk_cases(models, rows_list, device, k=10):
    from specdraft.kernels.draft_topk.reference import draft_topk_reference
    from specdraft.kernels.draft_topk.triton_kernel import draft_topk_triton

    def unfused(draft_logits, d2t):  # what a runtime without the kernel would write (tie order unspecified)
        values, draft_ids = torch.log_softmax(draft_logits.float(), dim=-1).topk(k, dim=-1)
        return values, draft_ids + d2t[draft_ids]

    vocabs = sorted({v for model in models.values() for v in model["draft_vocabs"]})
    for vocab in vocabs:
        d2t = torch.randint(0, 1000, (vocab,), device=device)
        for rows in rows_list:
            logits = torch.randn(rows, vocab, device=device).mul_(4).bfloat16()
            shape = f"N={rows} Vd={vocab} k={k}"
            def fused(x=logits, d2t=d2t):
                return draft_topk_triton(x, d2t, k)

            yield Case("draft_topk", shape, lambda x=logits, m=d2t: draft_topk_reference(x, m, k), fused,
                       _same(lambda e, g: torch.allclose(e[0], g[0], atol=1e-4) and torch.equal(e[1], g[1])))
            yield Case("draft_topk vs torch.topk", shape, lambda x=logits, m=d2t: unfused(x, m), fused,
                       _same(lambda e, g: torch.allclose(e[0], g[0], atol=1e-4)))


def entropy_cases(models, rows_list, device, top=1000):
    """top_entropy (a tree scorer's parent entropy, per depth of a scored tree) at the draft vocabularies."""
    from specdraft.kernels.top_entropy.reference import top_entropy_reference
    from specdraft.kernels.top_entropy.triton_kernel import top_entropy_triton

    for vocab in sorted({v for model in models.values() for v in model["draft_vocabs"]}):
        for rows in rows_list:
            logits = torch.randn(rows, vocab, device=device).mul_(4).bfloat16()
            yield Case("top_entropy", f"N={rows} Vd={vocab} M={top}",
                       lambda x=logits: top_entropy_reference(x, top), lambda x=logits: top_entropy_triton(x, top),
                       _same(lambda e, g: torch.allclose(e, g, rtol=1e-4, atol=1e-4)))


def prune_cases(models, rows_list, device, top=1000, hidden=48):
    """prune_children (C2T's pruning of one depth: the parents' top-M entropy, the FFN and the cut) at the draft
    vocabularies, k = rows children a parent, about half of them dropped."""
    from specdraft.kernels.prune_children.reference import ScorerWeights, prune_children_reference
    from specdraft.kernels.prune_children.triton_kernel import prune_children_triton

    for vocab in sorted({v for model in models.values() for v in model["draft_vocabs"]}):
        for rows in rows_list:
            logits = torch.randn(rows, vocab, device=device).mul_(4).bfloat16()
            children = torch.log_softmax(logits.float(), -1).topk(rows, -1).values  # [p, k]
            parents = -torch.rand(rows, device=device)
            weights = ScorerWeights(torch.randn(hidden, 3, device=device), torch.randn(hidden, device=device),
                                    torch.randn(hidden, device=device) / hidden ** 0.5, torch.zeros(1, device=device),
                                    torch.zeros(1, device=device))
            args = (children, parents, logits, 3, weights, top)
            yield Case("prune_children", f"p=k={rows} Vd={vocab} M={top} Hc={hidden}",
                       lambda a=args: prune_children_reference(*a), lambda a=args: prune_children_triton(*a),
                       _same(lambda e, g: (torch.isinf(e) == torch.isinf(g)).float().mean() > 0.99))


def verify_cases(models, nodes_list, device, depth_limit=8):
    from specdraft.kernels.tree_verify.reference import verify_greedy_reference
    from specdraft.kernels.tree_verify.triton_kernel import verify_greedy_triton

    for vocab in sorted({model["vocab"] for model in models.values()}):
        for num_nodes in nodes_list:
            parents, _ = _binary_tree(num_nodes, device)
            logits = torch.randn(num_nodes, vocab, device=device).bfloat16()
            tokens = logits.argmax(-1)[parents.clamp(min=0)]  # every node matches: the walk goes deepest
            args = (logits, tokens, parents, depth_limit)
            yield Case("verify_greedy", f"N={num_nodes} V={vocab}", lambda a=args: verify_greedy_reference(*a),
                       lambda a=args: verify_greedy_triton(*a),
                       _same(lambda e, g: all(torch.equal(x, y) for x, y in zip(e, g))))


def _compact_check(caches, args):
    from specdraft.kernels.kv_compact.reference import compact_kv_reference
    from specdraft.kernels.kv_compact.triton_kernel import compact_kv_triton

    def check(case):
        expected, got = [c.clone() for c in caches], [c.clone() for c in caches]
        compact_kv_reference(*expected, *args)
        compact_kv_triton(*got, *args)
        return all(torch.equal(e, g) for e, g in zip(expected, got))
    return check


def compact_cases(models, entries_list, seq_len, device):
    from specdraft.kernels.kv_compact.reference import compact_kv_reference
    from specdraft.kernels.kv_compact.triton_kernel import compact_kv_triton

    for name, model in models.items():
        shape = (model["layers"], model["kv_heads"], seq_len, model["head_dim"])
        caches = [torch.randn(shape, device=device).bfloat16() for _ in range(2)]
        for entries in entries_list:  # every other tree node accepted, the last entry padding
            args = (torch.arange(entries, device=device) * 2 + seq_len // 2,
                    torch.tensor([seq_len // 2], device=device), torch.tensor([entries - 1], device=device))
            yield Case("compact_kv", f"{name} L={shape[0]} Hkv={shape[1]} D={shape[3]} M={entries}",
                       lambda c=caches, a=args: compact_kv_reference(*c, *a),
                       lambda c=caches, a=args: compact_kv_triton(*c, *a), _compact_check(caches, args))


def attention_cases(models, nodes_list, seq_len, device):
    from specdraft.kernels.tree_attention.reference import tree_attention_reference
    from specdraft.kernels.tree_attention.triton_kernel import tree_attention_triton

    for name, model in models.items():
        kv_shape = (model["kv_heads"], seq_len, model["head_dim"])
        k_cache, v_cache = (torch.randn(kv_shape, device=device).bfloat16() for _ in range(2))
        for num_nodes in nodes_list:
            q = torch.randn(model["q_heads"], num_nodes, model["head_dim"], device=device).bfloat16()
            prefix_len = torch.tensor([seq_len * 3 // 4], device=device)
            args = (q, k_cache, v_cache, prefix_len, _binary_tree(num_nodes, device)[1], model["head_dim"] ** -0.5)
            yield Case("tree_attention", f"{name} Hq={q.shape[0]} Hkv={kv_shape[0]} D={kv_shape[2]} N={num_nodes} "
                       f"S={seq_len} prefix={int(prefix_len)}", lambda a=args: tree_attention_reference(*a),
                       lambda a=args: tree_attention_triton(*a),
                       _same(lambda e, g: torch.allclose(e.float(), g.float(), rtol=2e-2, atol=2e-2)))


def _close_and_bitwise(pairs):
    """(within one bfloat16 rounding step, the same bits) over pairs of output tensors."""
    close = all(torch.allclose(e.float(), g.float(), rtol=2 ** -7, atol=1e-6) for e, g in pairs)
    return close, all(torch.equal(e, g) for e, g in pairs)


def _layer_case(op, shape, implementations, timed, outputs):
    """implementations (reference, triton); timed(impl) -> the call to time; outputs(impl) -> its output tensors
    (caches included) on fresh copies of the inputs."""
    reference, fused = implementations

    def compare():
        return _close_and_bitwise(list(zip(outputs(reference), outputs(fused))))
    return Case(op, shape, timed(reference), timed(fused), lambda case: compare()[0], lambda case: compare()[1])


def _outputs(result):
    return list(result) if isinstance(result, tuple) else [result]


def norm_cases(models, rows_list, device, eps=1e-5):
    from specdraft.kernels.rms_norm.reference import rms_norm_reference
    from specdraft.kernels.rms_norm.triton_kernel import rms_norm_triton

    for name, model in models.items():
        hidden = model["hidden"]
        weight = (1 + torch.randn(hidden, device=device) / 4).bfloat16()
        for rows in rows_list:
            x, residual = (torch.randn(rows, hidden, device=device).bfloat16() for _ in range(2))
            for op, args in (("rms_norm", (x, weight, eps)), ("add_rms_norm", (x, weight, eps, residual))):
                yield _layer_case(op, f"{name} N={rows} H={hidden}", (rms_norm_reference, rms_norm_triton),
                                  lambda impl, a=args: lambda: impl(*a), lambda impl, a=args: _outputs(impl(*a)))


def rope_cases(models, rows_list, seq_len, device):
    from specdraft.kernels.rope_cache.reference import rope_cache_reference
    from specdraft.kernels.rope_cache.triton_kernel import rope_cache_triton

    for name, model in models.items():
        q_heads, kv_heads, head_dim = model["q_heads"], model["kv_heads"], model["head_dim"]
        cos, sin = (torch.randn(seq_len, head_dim, device=device).bfloat16() for _ in range(2))
        caches = [torch.randn(kv_heads, seq_len, head_dim, device=device).bfloat16() for _ in range(2)]
        for rows in rows_list:
            qkv = torch.randn(rows, (q_heads + 2 * kv_heads) * head_dim, device=device).bfloat16()
            q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            slots = torch.arange(rows, device=device) + seq_len // 2  # [N] the new tokens' cache slots
            args = (q.view(rows, q_heads, head_dim), k.view(rows, kv_heads, head_dim),
                    v.view(rows, kv_heads, head_dim), cos, sin, slots - 3)

            def outputs(impl, args=args, slots=slots, caches=caches):
                fresh = [cache.clone() for cache in caches]
                return [impl(*args, *fresh, slots), *fresh]
            yield _layer_case("rope_cache", f"{name} Hq={q_heads} Hkv={kv_heads} D={head_dim} N={rows}",
                              (rope_cache_reference, rope_cache_triton),
                              lambda impl, a=args, s=slots, c=caches: lambda: impl(*a, *c, s), outputs)


def draft_input_cases(models, rows_list, device, eps=1e-5):
    from specdraft.kernels.draft_input.reference import draft_input_reference
    from specdraft.kernels.draft_input.triton_kernel import draft_input_triton

    for name, model in models.items():
        hidden = model["hidden"]
        embed_weight = torch.randn(model["vocab"], hidden, device=device).bfloat16()
        norms = [(1 + torch.randn(hidden, device=device) / 4).bfloat16() for _ in range(2)]
        for rows in rows_list:
            args = (torch.randint(0, model["vocab"], (rows,), device=device), embed_weight,
                    torch.randn(rows, hidden, device=device).bfloat16(), *norms, eps)
            yield _layer_case("draft_input", f"{name} N={rows} H={hidden}", (draft_input_reference, draft_input_triton),
                              lambda impl, a=args: lambda: impl(*a), lambda impl, a=args: [impl(*a)])


def silu_mul_cases(models, rows_list, device):
    from specdraft.kernels.silu_mul.reference import silu_mul_reference
    from specdraft.kernels.silu_mul.triton_kernel import silu_mul_triton

    for name, model in models.items():
        for rows in rows_list:
            halves = torch.randn(rows, 2 * model["intermediate"], device=device).bfloat16().chunk(2, dim=-1)
            yield _layer_case("silu_mul", f"{name} N={rows} I={model['intermediate']}",
                              (silu_mul_reference, silu_mul_triton), lambda impl, h=halves: lambda: impl(*h),
                              lambda impl, h=halves: [impl(*h)])


MOE_MODELS = {"qwen3-30b-a3b": {"hidden": 2048, "inter": 768, "experts": 128, "top_k": 8}}
TINY_MOE = {"tiny": {"hidden": 64, "inter": 48, "experts": 8, "top_k": 2}}


def grouped_experts_cases(models, rows_list, device):
    """Random routing (distinct experts within a row); the reference runs every expert over every row, masked."""
    from specdraft.kernels.grouped_experts.reference import grouped_experts_reference
    from specdraft.kernels.grouped_experts.triton_kernel import grouped_experts_triton

    for name, model in models.items():
        hidden_size, inter, experts, top_k = model["hidden"], model["inter"], model["experts"], model["top_k"]
        gate_up = torch.randn(experts, 2 * inter, hidden_size, device=device).div_(hidden_size ** 0.5).bfloat16()
        down = torch.randn(experts, hidden_size, inter, device=device).div_(inter ** 0.5).bfloat16()
        for rows in rows_list:
            args = (torch.randn(rows, hidden_size, device=device).bfloat16(), gate_up, down,
                    torch.rand(rows, experts, device=device).argsort(dim=1)[:, :top_k],
                    torch.softmax(torch.randn(rows, top_k, device=device), dim=-1))
            yield Case("grouped_experts", f"{name} N={rows} E={experts} k={top_k}",
                       lambda a=args: grouped_experts_reference(*a), lambda a=args: grouped_experts_triton(*a),
                       _same(lambda e, g: torch.allclose(e.float(), g.float(), rtol=2e-2, atol=2e-2)))


def frontier_cases(models, topks, device):
    from specdraft.kernels.tree_frontier.reference import advance_frontier_reference
    from specdraft.kernels.tree_frontier.triton_kernel import advance_frontier_triton

    for name, model in models.items():
        for k in topks:
            args = (-torch.rand(k, k, device=device) * 5, torch.randint(0, model["vocab"], (k, k), device=device),
                    -torch.rand(k, device=device), torch.arange(1, k + 1, device=device), 1 + k,
                    torch.randn(k, model["hidden"], device=device).bfloat16(),
                    torch.rand(k, 1 + 6 * k, device=device) > 0.5)
            yield Case("advance_frontier", f"{name} k={k} H={model['hidden']}",
                       lambda a=args: advance_frontier_reference(*a), lambda a=args: advance_frontier_triton(*a),
                       _same(lambda e, g: all(torch.equal(x, y) for x, y in zip(e, g))))


def select_cases(shapes, device):
    from specdraft.kernels.tree_select.reference import select_tree_reference
    from specdraft.kernels.tree_select.triton_kernel import select_tree_triton
    for depth, topk, budget in shapes:
        count = 1 + topk + (depth - 1) * topk * topk  # the expansion's candidates; each hangs under an earlier one
        parents = torch.cat([torch.tensor([-1]), torch.arange(count - 1) // topk])
        scores = torch.zeros(count)
        for index in range(1, count):  # a child scores below its parent, as joint log-probabilities do
            scores[index] = scores[parents[index]] - 4 * torch.rand(())
        tokens = torch.randint(0, 49152, (count,))
        args = (tokens.to(device), parents.to(device), scores.to(device), budget, depth)
        yield Case("select_tree", f"depth={depth} topk={topk} budget={budget} C={count}",
                   lambda a=args: select_tree_reference(*a), lambda a=args: select_tree_triton(*a),
                   _same(lambda e, g: all(torch.equal(x, y) for x, y in zip(e, g))))


def commit_cases(models, depths, device):
    from specdraft.kernels.path_commit.reference import commit_path_reference
    from specdraft.kernels.path_commit.triton_kernel import commit_path_triton

    for name, model in models.items():
        for depth in depths:
            nodes = 8 * depth
            accepted = torch.full((depth + 1,), -1, dtype=torch.int64, device=device)
            accepted[:depth] = torch.arange(0, 2 * depth, 2, device=device)  # the root and depth - 1 accepted
            captured = [torch.randn(nodes, model["hidden"], device=device).bfloat16() for _ in range(3)]
            args = (accepted, torch.tensor([depth - 1], device=device), torch.tensor([7], device=device),
                    torch.randint(0, model["vocab"], (nodes,), device=device), torch.tensor([300], device=device),
                    captured)
            roots = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(2)]
            yield Case("commit_path", f"{name} D={depth} H={model['hidden']} 3 layers",
                       lambda a=args, r=roots[0]: commit_path_reference(*a, r),
                       lambda a=args, r=roots[1]: commit_path_triton(*a, r),
                       _same(lambda e, g: all(torch.equal(x, y) for x, y in zip(e[:3] + e[3], g[:3] + g[3]))))


def all_cases(device: torch.device, ops: set):
    tiny = device.type == "cpu"
    models = TINY if tiny else MODELS
    nodes = (1, 5) if tiny else (1, 8, 32, 64)
    seq_len = 64 if tiny else 2048
    makers = {"draft_topk": lambda: topk_cases(models, nodes, device),
              "verify_greedy": lambda: verify_cases(models, nodes, device),
              "compact_kv": lambda: compact_cases(models, (4,) if tiny else (8, 16), seq_len, device),
              "tree_attention": lambda: attention_cases(models, nodes, seq_len, device),
              "rms_norm": lambda: norm_cases(models, nodes, device),
              "rope_cache": lambda: rope_cases(models, nodes, seq_len, device),
              "silu_mul": lambda: silu_mul_cases(models, nodes, device),
              "grouped_experts": lambda: grouped_experts_cases(TINY_MOE if tiny else MOE_MODELS, nodes, device),
              "draft_input": lambda: draft_input_cases(models, nodes, device),
              "advance_frontier": lambda: frontier_cases(models, (4,) if tiny else (8, 10), device),
              "select_tree": lambda: select_cases([(3, 2, 6)] if tiny else [(6, 8, 48), (6, 10, 60)], device),
              "commit_path": lambda: commit_cases(models, (3,) if tiny else (5, 6), device),
              "top_entropy": lambda: entropy_cases(models, (4,) if tiny else (8, 10), device, 100 if tiny else 1000),
              "prune_children": lambda: prune_cases(models, (4,) if tiny else (8, 10), device,
                                                    100 if tiny else 1000)}
    for op, make in makers.items():
        if op in ops:
            yield from make()


def time_us(fn: Callable[[], object], device: torch.device, iters: int, reps: int) -> tuple[float, str]:
    """(median µs per call, how it ran): a CUDA graph of `iters` calls on CUDA (eager if capture fails), wall
    clock on the CPU (no warm-up: the interpreter compiles nothing)."""
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e6 / iters, "cpu"
    run, how = _graph_of(fn, iters), "graph"
    if run is None:
        run, how = (lambda: [fn() for _ in range(iters)]), "eager"
    run()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(samples), how


def _graph_of(fn, iters: int):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiles, and warms up allocations off the default stream, before the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
    except RuntimeError as error:
        print(f"  (CUDA graph capture failed, timing eagerly: {str(error).splitlines()[0]})")
        torch.cuda.synchronize()
        return None
    return graph.replay


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="each Triton kernel against its PyTorch reference")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="runs/bench", help="a directory (OUT/kernels.json) or a .json path")
    parser.add_argument("--ops", default="draft_topk,verify_greedy,compact_kv,tree_attention,rms_norm,rope_cache,"
                                         "silu_mul,draft_input,advance_frontier,select_tree,commit_path,top_entropy,"
                                         "prune_children,grouped_experts")
    parser.add_argument("--iters", type=int, default=20, help="calls per CUDA graph")
    parser.add_argument("--reps", type=int, default=15, help="timed graph replays (the median is reported)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
        args.iters, args.reps = 1, 1
    import triton

    torch.manual_seed(0)
    rows = []
    for case in all_cases(device, set(args.ops.split(","))):
        match = bool(case.check(case))
        reference_us, how = time_us(case.reference, device, args.iters, args.reps)
        triton_us, triton_how = time_us(case.triton, device, args.iters, args.reps)
        rows.append({"op": case.op, "shape": case.shape, "reference_us": round(reference_us, 2),
                     "triton_us": round(triton_us, 2), "speedup": round(reference_us / triton_us, 2),
                     "match": match, "timing": how if how == triton_how else f"{how}/{triton_how}"})
        if case.bitwise is not None:
            rows[-1]["bitwise"] = bool(case.bitwise(case))
        print(f"{case.op} {case.shape}: {reference_us:.1f} -> {triton_us:.1f} µs, match {match}", flush=True)
    result = {"machine": machine(args.device) + ("" if device.type == "cuda" else " (Triton interpreter)"),
              "torch": torch.__version__, "triton": triton.__version__,
              "all_match": all(row["match"] for row in rows), "rows": rows}
    table = markdown_table(["op", "shape", "reference µs", "Triton µs", "speedup", "outputs match"],
                           [[row["op"], row["shape"], f"{row['reference_us']:.1f}", f"{row['triton_us']:.1f}",
                             f"{row['speedup']:.2f}×", row["match"]] for row in rows])
    return finish(table, args.out, result, "kernels")


if __name__ == "__main__":
    raise SystemExit(0 if main()["all_match"] else 1)
