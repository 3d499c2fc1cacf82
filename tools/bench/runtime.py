"""Runtime suite: speculative against plain decoding in specdraft's runtime, shape by shape, with the cycle's time
split (`speedup`, the default); Kangaroo's exit layer ℓ and confidence exit η swept (`kangaroo`); and the floors
of the plain loop and the cycle, their graphs replayed back to back on a random target (`gaps`).

    python -m tools.bench.runtime EXPORT --shapes 5,8,40 6 --target SmolLM2-135M-Instruct.Q4_1.gguf \\
        --prompts mt_bench.jsonl --max-prompts 80 --out runs/bench                  # the default tree and a chain
    python -m tools.bench.runtime EXPORT --shapes 5,8,40 --max-prompts 10 --hf-prompts 10 --out DIR   # and HF
    python -m tools.bench.runtime kangaroo EXPORT_L1 EXPORT_L2 ... --eta 0 --depth 3 --choose-exit --out DIR
    python -m tools.bench.runtime gaps --config smollm2 --shape 5,8,40 --tokens 256 --out DIR

`speedup`: a shape is DEPTH,TOPK,BUDGET (a tree: TOPK children per expanded node, BUDGET nodes verified with the
root) or DEPTH alone (a chain of DEPTH drafts). The target and draft are loaded once; each shape builds its own
runtime over them (its CUDA graphs are per shape) and runs `specdraft bench` at T=0 on the same prompts
(`specdraft.runtime.bench.run_bench`): every prompt decoded plainly, then speculatively, in the same process,
lossless-checked token for token, then the first --lossless-prompts again in float32. Each shape's bench.json
goes to OUT/runtime/SHAPE/; the table has, per shape: τ, both rates and the speedup, the speedup over the median
of every shape's plain rate (so that one plain run that reads slow does not decide the ranking), plain decoding
against Hugging Face `generate` (with --hf-prompts N: on the first N prompts), the graphed cycle and its split
into draft, verify and bookkeeping (each phase in its own CUDA graph), what a cycle and a plain step cost in the
loop (a least-squares fit over the prompts: seconds = a prompt's cost + a step's cost x steps) and what a
prompt costs outside them (its prefill), and the float32 check. OUT/runtime.json.

`kangaroo`: each export (one ℓ each) is loaded once as a chain of --depth drafts; for every η the runtime decodes
the same prompts at T=0 with plain decoding and with speculative decoding, in the same run. `--choose-exit` adds
the rows of one runtime holding every export, where DEL picks the exit layer and the draft length per cycle (ℓ
shown as "1+2", with the share of cycles drafted at each ℓ in the JSON). OUT/kangaroo.json.

`gaps`: on a random target of a real geometry (launch-bound work does not depend on the weights), one prompt's
decoding timed as
  graph         the plain step's graph replayed back to back (the device's floor)
  graph+argmax  the same, each step's argmax eager after it, fed to the next (no read-back)
  fused         step and argmax in one graph, fed to the next (no read-back)
  loop          `decode_plain`'s loop without its prefill: argmax, staged copy, one step in flight
  decode_plain  the whole call as `bench` times it (prefill included), and the prefill alone
  cycle, generate  the speculative cycle's graph back to back, and `generate` as `bench` times it
ms a step for each; OUT/loop_gaps.json. On a CPU it runs eagerly (no graphs): a check that it works, not a
measurement.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

from tools.bench.suite import finish, fmt, machine, markdown_table, run_parts, write_report
from tools.count_cycle_launches import build_engine as random_engine, check_shapes, parse_shape

import torch

from specdraft.config import RuntimeConfig


def fit_line(steps: Sequence[float], seconds: Sequence[float]) -> Tuple[float, float]:
    """Least squares seconds = a + b * steps -> (a, b); with one distinct step count, a = 0."""
    count = len(steps)
    mean_steps, mean_seconds = sum(steps) / count, sum(seconds) / count
    spread = sum((s - mean_steps) ** 2 for s in steps)
    if spread == 0:
        return 0.0, mean_seconds / mean_steps
    slope = sum((s - mean_steps) * (t - mean_seconds) for s, t in zip(steps, seconds)) / spread
    return mean_seconds - slope * mean_steps, slope


def loop_costs(run: Dict) -> Dict[str, float]:
    """A bench run's per-prompt figures -> ms a prompt and ms a step (plain) or a cycle (speculative), fitted."""
    rows = run["per_prompt"]
    plain_a, plain_b = fit_line([r["plain_tokens"] for r in rows], [r["plain_s"] for r in rows])
    spec_a, spec_b = fit_line([r["spec_cycles"] for r in rows], [r["spec_s"] for r in rows])
    return {"plain_prompt_ms": 1000 * plain_a, "plain_step_ms": 1000 * plain_b,
            "spec_prompt_ms": 1000 * spec_a, "spec_cycle_ms": 1000 * spec_b}


def bench_shape(args, parts, float32_parts: Callable, text: str) -> dict:
    """One shape's bench at T=0 over the loaded parts -> its row (the whole report in OUT/runtime/SHAPE/)."""
    from specdraft.runtime.bench import BenchSettings, run_bench
    from specdraft.runtime.load import build_runtime

    shape = parse_shape(text)
    settings_of = functools.partial(RuntimeConfig, depth=shape.depth, topk=shape.topk, budget=shape.budget,
                                    max_len=args.max_len, cuda_graphs=not args.no_cuda_graphs)
    runtime = build_runtime(*parts, settings_of(device=args.device, dtype=args.dtype))
    settings = BenchSettings(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, temperatures=(0.0,),
                             hf_baseline=args.hf_prompts > 0, hf_prompts=args.hf_prompts or None,
                             lossless_prompts=args.lossless_prompts,
                             **({"prompts": args.prompts} if args.prompts else {}))
    report = run_bench(runtime, settings, args.out / "runtime" / text.replace(",", "-"),
                       load_float32=lambda: build_runtime(*float32_parts(), settings_of(device=args.device,
                                                                                        dtype="float32")))
    run, profile = report["runs"][0], report["cycle_profile"]
    keep = ("tau", "tokens_per_s", "tokens_per_s_plain", "speedup_vs_plain", "tokens_per_s_hf", "plain_vs_hf",
            "hf_prompts", "lossless_prompts", "prompts", "acceptance_by_position", "cycles")
    return {"shape": text, "depth": shape.depth, "topk": shape.topk, "budget": shape.budget,
            **{key: run[key] for key in keep}, "cycle_ms": profile["cycle_ms"],
            "plain_graph_ms": profile["plain_step_ms"], "graph_split_ms": profile.get("graph_split_ms"), "loop": loop_costs(run),
            "prompt_warmup": run["prompt_warmup"], "lossless_float32": report["float32_check"]}


def with_median_plain(rows: List[dict]) -> List[dict]:
    """Each benched row with speedup_vs_median_plain: its tokens/s over the median plain rate of all rows."""
    plain_rates = [row["tokens_per_s_plain"] for row in rows if "error" not in row]
    if not plain_rates:
        return rows
    median = statistics.median(plain_rates)
    return [row if "error" in row else {**row, "speedup_vs_median_plain": row["tokens_per_s"] / median}
            for row in rows]


def speedup_table(rows: List[dict]) -> str:
    lines = []
    for row in sorted(rows, key=lambda r: -(r.get("speedup_vs_median_plain") or 0)):
        if "error" in row:
            lines.append([row["shape"], "error: " + row["error"].splitlines()[0][:80], *[""] * 10])
            continue
        split, loop, check = row["graph_split_ms"], row["loop"], row["lossless_float32"]
        lines.append([
            row["shape"], f"{row['tau']:.3f}", f"{row['tokens_per_s']:,.1f}", f"{row['tokens_per_s_plain']:,.1f}",
            f"{row['speedup_vs_plain']:.3f}", f"{row['speedup_vs_median_plain']:.3f}", fmt(row["plain_vs_hf"], ".1f"),
            f"{row['cycle_ms']:.3f}", " / ".join(f"{split[k]:.3f}" for k in split) if split else "-",
            f"{loop['spec_cycle_ms']:.3f} / {loop['plain_step_ms']:.3f} ({row['plain_graph_ms']:.3f})",
            f"{loop['spec_prompt_ms']:.1f} / {loop['plain_prompt_ms']:.1f}",
            f"{check['identical']}/{check['prompts']}" if check else "-"])
    return markdown_table(["shape", "τ", "spec tok/s", "plain tok/s", "× plain", "× median plain", "plain × HF",
                           "cycle graph ms", "draft / verify / bookkeeping ms", "loop ms a cycle / a step (graph)",
                           "ms a prompt, spec / plain", "float32 lossless"], lines)


def speedup_main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="speculative against plain decoding, shape by shape")
    parser.add_argument("export", help="an export directory (or a training run directory)")
    parser.add_argument("--shapes", nargs="+", default=["5,8,40", "6"],
                        help="DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree); default: the default tree and chain")
    parser.add_argument("--prompts", default=None, help="a prompt file, as for `specdraft bench --prompts` "
                                                        "(default: MT-bench's questions)")
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--hf-prompts", type=int, default=0, metavar="N",
                        help="time Hugging Face generate on the first N prompts too (default: not at all)")
    parser.add_argument("--lossless-prompts", type=int, default=10, metavar="N",
                        help="prompts decoded again in float32, speculative against plain (0: none)")
    parser.add_argument("--target", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = parser.parse_args(argv)
    from specdraft.runtime.load import load_parts

    check_shapes(parser, args.shapes)
    parts = load_parts(args.export, RuntimeConfig(device=args.device, dtype=args.dtype), args.target)
    float32_parts = functools.lru_cache(maxsize=1)(
        lambda: load_parts(args.export, RuntimeConfig(device=args.device, dtype="float32"), args.target))
    report = {"export": str(args.export), "machine": machine(str(parts[1].model.device)), "prompts": args.prompts,
              "max_prompts": args.max_prompts, "max_new_tokens": args.max_new_tokens, "rows": []}
    for text in args.shapes:
        try:
            report["rows"].append(bench_shape(args, parts, float32_parts, text))
        except Exception as err:  # recorded; the next shape still runs
            report["rows"].append({"shape": text, "error": f"{type(err).__name__}: {err}"[:2000]})
        report["rows"] = with_median_plain(report["rows"])
        write_report(args.out, report, "runtime")
    return finish(speedup_table(report["rows"]), args.out, report, "runtime")


def kangaroo_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Kangaroo's exit layer ℓ and confidence exit η, swept")
    parser.add_argument("exports", nargs="+", help="Kangaroo export directories (one exit layer each)")
    parser.add_argument("--eta", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--prompts", default=None, help="prompt file (default: MT-bench's questions)")
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--depth", type=int, default=6, help="chain length before exits")
    parser.add_argument("--dynamic-exit", action="store_true", help="DEL's draft length as well")
    parser.add_argument("--choose-exit", action="store_true", help="also: all exports in one runtime, DEL choosing ℓ")
    parser.add_argument("--no-shallow-reuse", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--out", default="runs/bench")
    return parser.parse_args(argv)


def sweep_export(paths: List[str], args: argparse.Namespace) -> List[dict]:
    """Every η over one export (or, with several, all in one runtime choosing the exit) -> one row per η."""
    from specdraft.runtime.bench import BenchSettings, first_user_turns, run_temperature
    from specdraft.runtime.load import load_runtime

    runtime_cfg = RuntimeConfig(chain=True, depth=args.depth, exit_threshold=0.0,
                                dynamic_exit=args.dynamic_exit or len(paths) > 1,
                                shallow_reuse=not args.no_shallow_reuse, more_exits=list(paths[1:]),
                                device=args.device, dtype=args.dtype, max_len=args.max_len)
    runtime = load_runtime(paths[0], runtime_cfg)
    settings = BenchSettings(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, temperatures=(0.0,),
                             hf_baseline=False, **({"prompts": args.prompts} if args.prompts else {}))
    prompts = first_user_turns(runtime, settings.prompts, settings.max_prompts)
    caps = runtime.engine.drafter.caps  # one exit layer (shallow_layers), or several chosen per cycle
    layers = caps.exit_layers or (caps.shallow_layers,)
    adapter_params = _adapter_params(paths) if len(paths) > 1 else _params(runtime.draft.draft)
    rows = []
    for eta in args.eta:
        runtime.engine.set_exit_threshold(eta)
        summary = run_temperature(runtime, prompts, settings, 0.0, [])
        rows.append({"exports": paths, "exit_layer": "+".join(map(str, layers)), "eta": eta,
                     "verify_start_layer": runtime.engine.chain.start_layer, "adapter_params": adapter_params,
                     **summary})
    return rows


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _adapter_params(paths: List[str]) -> int:
    from specdraft.drafts import load_draft

    return sum(_params(load_draft(path).draft) for path in paths)


def kangaroo_table(rows: List[dict]) -> str:
    return markdown_table(["ℓ", "η", "τ", "drafted/cycle", "spec tok/s", "plain tok/s", "speedup", "lossless",
                           "adapter params"],
                          [[r["exit_layer"], f"{r['eta']:g}", f"{r['tau']:.2f}", f"{r['drafted_per_cycle']:.2f}",
                            f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s_plain']:.1f}",
                            f"{r['speedup_vs_plain']:.2f}", r["lossless"], f"{r['adapter_params']:,}"] for r in rows])


def kangaroo_main(argv=None) -> dict:
    args = kangaroo_args(argv)
    runs = [[path] for path in args.exports] + ([list(args.exports)] if args.choose_exit else [])
    rows = [row for paths in runs for row in sweep_export(paths, args)]
    settings = {k: v for k, v in vars(args).items() if k != "exports"}
    return finish(kangaroo_table(rows), args.out, {"machine": machine(), "settings": settings, "rows": rows},
                  "kangaroo")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_ms(device: torch.device, run: Callable[[], object]) -> float:
    _sync(device)
    started = time.perf_counter()
    run()
    _sync(device)
    return 1000 * (time.perf_counter() - started)


def _steps(engine, prompt: torch.Tensor, tokens: int, step: Callable) -> float:
    """Prefill, then `step(token) -> token` `tokens` times without reading anything back -> ms a step."""
    engine.prefill(prompt, 0.0)
    token = engine.root.clone()

    def run():
        nonlocal token
        for _ in range(tokens):
            token = step(token)
    return _timed_ms(engine.device, run) / tokens


def measure_gaps(engine, prompt_ids, tokens: int) -> Dict[str, float]:
    """One prompt's decoding taken apart (the docstring's `gaps` rows) -> ms a step of each."""
    from specdraft.decoding.graphs import CallGraph
    from specdraft.decoding.sampling import sample_token

    device = engine.device
    prompt = torch.tensor(prompt_ids, device=device)
    engine.decode_plain(prompt_ids, 32)  # captures the plain step's graph
    engine.generate(prompt_ids, 32)  # and the cycle's
    plain = engine.plain_stepper(engine.root.clone())
    graph_only = _steps(engine, prompt, tokens, lambda token: (plain(token), token)[1])
    eager_argmax = _steps(engine, prompt, tokens, lambda token: sample_token(plain(token), 0.0))
    step_and_argmax = (lambda token: sample_token(engine.plain_step(token), 0.0))
    if engine.use_graphs:
        state = [engine.prefix_len, engine.target.k_cache, engine.target.v_cache]
        step_and_argmax = CallGraph(step_and_argmax, state, example=(engine.root.clone(),))
        engine.prefill(prompt, 0.0)
        step_and_argmax(engine.root.clone())  # its capture, untimed
    fused = _steps(engine, prompt, tokens, step_and_argmax)
    prefill = _timed_ms(device, lambda: engine.prefill(prompt, 0.0))
    whole = engine.decode_plain(prompt_ids, tokens)
    spec = engine.generate(prompt_ids, tokens)
    engine.prefill(prompt, 0.0)
    cycle = _timed_ms(device, lambda: [engine.cycle(0.0, None) for _ in range(16)]) / 16
    decode_ms = 1000 * whole.seconds
    return {"graph": graph_only, "graph+argmax": eager_argmax, "fused": fused,
            "loop": (decode_ms - prefill) / len(whole.tokens), "decode_plain": decode_ms / len(whole.tokens),
            "prefill_ms": prefill, "cycle": cycle, "generate_per_cycle": 1000 * spec.seconds / len(spec.accepted),
            "generate_cycles": len(spec.accepted), "plain_tokens": len(whole.tokens)}


def gaps_main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="the plain loop and the cycle against their graphs, on a random "
                                                 "target")
    parser.add_argument("--config", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--shape", default="5,8,40", help="the speculative tree: depth,topk,budget (or a depth)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=2048, help="cache slots, as `bench` allocates them")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    check_shapes(parser, [args.shape])
    device = torch.device(args.device)
    engine = random_engine(args.config, parse_shape(args.shape), args.max_len, device)
    vocab = engine.target.info.vocab_size
    prompt_ids = torch.randint(0, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    runs = [measure_gaps(engine, prompt_ids, args.tokens) for _ in range(args.repeats)]
    table = markdown_table(["ms a step", *(f"run {i + 1}" for i in range(len(runs)))],
                           [[key, *(f"{run[key]:.3f}" for run in runs)] for key in runs[0]])
    report = {"config": args.config, "shape": args.shape, "tokens": args.tokens, "prompt_len": args.prompt_len,
              "machine": machine(args.device), "cuda_graphs": engine.use_graphs, "runs": runs}
    return finish(table, args.out, report, "loop_gaps")


def main(argv=None) -> dict:
    return run_parts({"speedup": speedup_main, "kangaroo": kangaroo_main, "gaps": gaps_main}, argv)


if __name__ == "__main__":
    main()
