"""Where plain decoding's time goes between its CUDA graphs: the runtime's plain loop taken apart, step by step.

On SmolLM2 the bench's plain decoding ran at about 1.54 ms a token while its step's graph, replayed back to back,
took 0.95 ms (Session 18, H200); the speculative cycles lost far less beyond their graph. This script times, on
a random target of a real geometry (launch-bound work does not depend on the weights), one prompt's decoding as:

  graph         the plain step's graph replayed back to back (the device's floor)
  graph+argmax  the same, each step's argmax eager after it, fed to the next (no read-back)
  fused         step and argmax in one graph, fed to the next (no read-back)
  loop          `decode_plain`'s loop without its prefill: argmax, staged copy, one step in flight
  decode_plain  the whole call as `bench` times it (prefill included), and the prefill alone
  cycle, generate  the speculative tree cycle's graph back to back, and `generate` as `bench` times it

With --export (and --target, --prompts), a trained draft over its real target instead: `bench`'s own loop on
real prompts (which stop at EOS), prompt by prompt as `bench` runs them, the speculative one first, and blocked
(every plain decoding first),
with Python's garbage collector on and off, each prompt's prefill alone and its times (per_prompt in the JSON):
whether the time beyond the graphs comes from the prompts, the order or the host.

    python tools/plain_loop_gaps.py --config smollm2 --tokens 256 --out runs/plain_loop_gaps
    python tools/plain_loop_gaps.py --export EXPORT --target PATH --prompts mt_bench.jsonl --max-prompts 10

Prints ms a step for each and writes OUT/plain_loop_gaps.json. On CPU it runs eagerly (no graphs): a check that
the script works, not a measurement.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Callable, Dict

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools")]

from specdraft.core.io import write_json  # noqa: E402


def build_engine(config: str, shape_text: str, device: torch.device, max_len: int):
    """count_cycle_launches' random target and EAGLE-3 head, on `device`, for a tree of `shape_text`."""
    from bench_tree_shapes import parse_shape
    from count_cycle_launches import build_engine as random_engine

    return random_engine(config, parse_shape(shape_text), max_len, device)


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


def measure(engine, prompt_ids, tokens: int) -> Dict[str, float]:
    from specdraft.runtime.graphs import CallGraph
    from specdraft.runtime.sampling import sample_token

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


def _bench_order(engine, prompts, tokens: int, eos_ids, order: str):
    """Plain and speculative decoding of every prompt -> (plain results, speculative results). `order`:
    "interleaved" (prompt by prompt, plain first, as `bench` runs them), "spec_first" (prompt by prompt, the
    speculative one first: a cost paid by whichever loop meets a prompt first moves to it) or "blocked" (every
    plain decoding first)."""
    plain = lambda p: engine.decode_plain(p, tokens, eos_ids)  # noqa: E731
    spec = lambda p: engine.generate(p, tokens, eos_ids)  # noqa: E731
    if order == "blocked":
        plain_results = [plain(p) for p in prompts]
        return plain_results, [spec(p) for p in prompts]
    plain_results, spec_results = [], []
    for prompt in prompts:
        if order == "spec_first":
            spec_results.append(spec(prompt))
        plain_results.append(plain(prompt))
        if order != "spec_first":
            spec_results.append(spec(prompt))
    return plain_results, spec_results


def measure_real(runtime, prompts, tokens: int) -> Dict:
    """`bench`'s loop in its order and blocked, the garbage collector on and off; each prompt's prefill alone;
    the graphs back to back. ms a token (plain) and a cycle (speculative), prefill included as `bench` has it."""
    engine, device = runtime.engine, runtime.engine.device
    engine.decode_plain(prompts[0], 32, runtime.eos_ids)
    engine.generate(prompts[0], 32, runtime.eos_ids)
    row: Dict = {}
    for order, collector in (("interleaved", True), ("interleaved", False), ("spec_first", True), ("blocked", True)):
        gc.enable() if collector else gc.disable()
        plain, spec = _bench_order(engine, prompts, tokens, runtime.eos_ids, order)
        gc.enable()
        key = f"{order}_gc_{'on' if collector else 'off'}"
        row[f"plain_{key}"] = 1000 * sum(r.seconds for r in plain) / sum(len(r.tokens) for r in plain)
        row[f"cycle_{key}"] = 1000 * sum(r.seconds for r in spec) / sum(len(r.accepted) for r in spec)
    prefill = [_timed_ms(device, lambda: engine.prefill(torch.tensor(p, device=device), 0.0)) for p in prompts]
    row["prefill_ms"] = sum(prefill) / len(prefill)
    row["tokens_per_prompt"] = sum(len(r.tokens) for r in plain) / len(plain)
    row["cycles_per_prompt"] = sum(len(r.accepted) for r in spec) / len(spec)
    first = torch.tensor(prompts[0], device=device)
    engine.prefill(first, 0.0)
    step = engine.plain_stepper(engine.root.clone())
    row["graph"] = _steps(engine, first, tokens, lambda token: (step(token), token)[1])
    engine.prefill(first, 0.0)
    row["cycle"] = _timed_ms(device, lambda: [engine.cycle(0.0, None) for _ in range(16)]) / 16
    row["per_prompt"] = [{"prompt_len": len(p), "prefill_ms": ms, "plain_tokens": len(a.tokens),
                          "plain_ms": 1000 * a.seconds, "cycles": len(b.accepted), "spec_ms": 1000 * b.seconds}
                         for p, ms, a, b in zip(prompts, prefill, plain, spec)]
    return row


def first_seen(runtime, prompts, top: int = 30) -> Dict:
    """Each prompt's prefill and a 32-token plain decoding timed the first time its length is met and again,
    the first pass under cProfile (its `top` functions by cumulative time go to stdout): what a loop pays for a
    prompt length it has not run before."""
    import cProfile
    import pstats

    engine, device = runtime.engine, runtime.engine.device
    engine.decode_plain(prompts[0], 32, runtime.eos_ids)
    engine.generate(prompts[0], 32, runtime.eos_ids)
    fresh = [p for p in prompts if len(p) != len(prompts[0])]
    rows = []
    profiler = cProfile.Profile()
    for prompt in fresh:
        tensor = torch.tensor(prompt, device=device)
        profiler.enable()
        first = _timed_ms(device, lambda: engine.prefill(tensor, 0.0))
        profiler.disable()
        second = _timed_ms(device, lambda: engine.prefill(tensor, 0.0))
        rows.append({"prompt_len": len(prompt), "prefill_first_ms": first, "prefill_again_ms": second})
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)
    return {"first_seen": rows}


def _real(args) -> tuple:
    from specdraft.runtime.bench import first_user_turns
    from specdraft.config import RuntimeConfig
    from specdraft.runtime.load import load_runtime

    runtime = load_runtime(args.export, RuntimeConfig(device=args.device, max_len=args.max_len), args.target)
    prompts = first_user_turns(runtime, args.prompts, args.max_prompts)
    if args.first_seen:
        return runtime.engine, [first_seen(runtime, prompts)]
    return runtime.engine, [measure_real(runtime, prompts, args.tokens) for _ in range(args.repeats)]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--shape", default="6,8,48", help="the speculative tree: depth,topk,budget")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=2048, help="cache slots, as `bench` allocates them")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="runs/plain_loop_gaps")
    parser.add_argument("--export", default=None, help="a trained draft: its real target instead of a random one")
    parser.add_argument("--target", default=None, help="with --export: the target's path (default: the export's)")
    parser.add_argument("--prompts", default=None, help="with --export: a prompt file (MT-bench's questions)")
    parser.add_argument("--max-prompts", type=int, default=10)
    parser.add_argument("--first-seen", action="store_true",
                        help="with --export: each prompt's prefill the first time its length is met and again")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.export:
        engine, runs = _real(args)
    else:
        engine = build_engine(args.config, args.shape, device, max_len=args.max_len)
        vocab = engine.target.lm_head_weight.shape[0]
        prompt_ids = torch.randint(0, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
        runs = [measure(engine, prompt_ids, args.tokens) for _ in range(args.repeats)]
    print(f"{'ms a step':>26} " + " ".join(f"{f'run {i + 1}':>9}" for i in range(len(runs))))
    for key in [key for key in runs[0] if key not in ("per_prompt", "first_seen")]:
        print(f"{key:>26} " + " ".join(f"{run[key]:>9.3f}" for run in runs))
    for row in runs[0].get("first_seen", []):
        print(f"prompt of {row['prompt_len']:>4}: prefill {row['prefill_first_ms']:8.2f} ms first, "
              f"{row['prefill_again_ms']:8.2f} ms again")
    report = {"config": args.export or args.config, "shape": args.shape, "tokens": args.tokens, "prompt_len": args.prompt_len,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "cuda_graphs": engine.use_graphs, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "plain_loop_gaps.json", report)
    print(f"-> {out / 'plain_loop_gaps.json'}")
    return report


if __name__ == "__main__":
    main()
