"""The scaling suite's two host-work parts, on a CPU, run through it (`python -m tools.bench.scale zero3-host` and
`python -m tools.bench.scale target-linear`): the host work ZeRO-3 adds to a draft's forward, and the frozen
target's forward under DeepSpeed's linear and under PyTorch's.

`zero3-host`: each engine runs in a process of its own: one DeepSpeed rank (gloo) trains a tiny EAGLE-3 draft (7
TTT unrolls) on one fixed random batch under ZeRO-2, ZeRO-3 with the draft's weights partitioned (`3`: what a draft
larger than the GPU's 1/16 gets, train.zero3_persist=false) or ZeRO-3 with them whole and no module hooks
(`3-whole`: train.zero3_persist=auto on a GPU, specdraft.train.zero3). Before each step, a fixed piece of
pure-Python work (tools/profile_train.host_canary_ms) times the host's own pace: a forward that slows whenever
the canary does is bound by a host whose speed varies, not by more work. Tables, per engine, the forward's
main-thread CPU ms (median, p90), its Python calls (counted in the last step: a measure the host's pace leaves
alone), the canary's ms and their correlation; OUT/zero3_host.json has every step's.

`target-linear`: ZeRO-3 (its default `memory_efficient_linear`) replaces `torch.nn.functional.linear` process-wide
with an autograd Function, which every linear of the frozen target would pay (a Python call, argument binding by
`inspect.signature` included) though the target runs under no_grad; `capture_features` runs the target under
`specdraft.targets.features.torch_linear`, PyTorch's own op. A random Llama with Llama-3.1-8B's 32 layers (224
linears a forward) at a tiny width and a short row, so that the forward is bound by the host, runs with
DeepSpeed's linear installed, through DeepSpeed's Function (`deepspeed`) and through `torch_linear`, alternating
step by step so that both see the same host: the median main-thread CPU ms a forward (and p90) and the calls that
went through DeepSpeed's Function. OUT/target_linear.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specdraft.testing.ports import free_port
from tools.bench.suite import REPO, child_env, finish, fmt, machine, markdown_table

ZERO3_WARMUP = 10  # steps left out of the statistics (DeepSpeed records its parameter trace in the first)


ZERO3_ENGINES = ("2", "3", "3-whole")
"""zero3-host's engines: ZeRO-2; ZeRO-3 with the draft's weights partitioned (as a draft above DeepSpeed's 1e5-element
persistence threshold has them, train.zero3_persist=false) and gathered by its module hooks; ZeRO-3 with them whole
and no module hooks (train.zero3_persist=auto on a GPU, specdraft.train.zero3)."""


def zero3_worker(engine_name: str, steps: int) -> dict:
    """One rank, `steps` steps under one of ZERO3_ENGINES -> every step's forward CPU ms and canary ms, and the
    Python calls of the last forward (a count the host's pace does not change)."""
    import torch

    from specdraft.core.types import DraftContext, TargetInfo
    from specdraft.testing.tiny import tiny_llama_config
    from specdraft.testing.zero3 import LossModule, init_gloo_rank, plain_and_sharded, random_batch
    from specdraft.train.zero3 import drop_module_hooks, persistence_config
    from tools.profile_train import host_canary_ms

    torch.set_num_threads(1)
    init_gloo_rank()
    import deepspeed

    stage = int(engine_name[0])
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0} if stage == 3 else {"stage": 2}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    info = TargetInfo.from_hf_config(tiny_llama_config(), "tiny")
    ctx = DraftContext(target=info, token_counts=torch.arange(info.vocab_size))
    spec, cfg, plain, partitioned = plain_and_sharded(
        "eagle3", {"ttt_steps": 7, "draft_vocab_size": 256}, ctx, {**config, "zero_optimization": {"stage": 3}})
    if stage == 2:  # zero.Init above put DeepSpeed's linear in place: ZeRO-2 runs PyTorch's
        torch.nn.functional.linear = torch._C._nn.linear
    module = LossModule(spec, cfg, partitioned if stage == 3 else plain)
    if engine_name == "3-whole":
        zero.update(persistence_config(module))
    engine, zero_optimizer, *_ = deepspeed.initialize(model=module, config=config,
                                                      model_parameters=module.parameters())
    if engine_name == "3-whole":
        drop_module_hooks(zero_optimizer, engine.module)
    batch = random_batch(spec, cfg, info, torch.Generator().manual_seed(0), rows=1)
    forward_ms, canary_ms, calls = [], [], []
    for step in range(steps):
        canary_ms.append(host_canary_ms())
        started = time.thread_time()
        with _python_calls(calls, counting=step == steps - 1):
            loss = engine(batch)
        forward_ms.append(1e3 * (time.thread_time() - started))
        engine.backward(loss)
        engine.step()
    return {"engine": engine_name, "forward_cpu_ms_each": forward_ms, "canary_ms_each": canary_ms,
            "forward_python_calls": len(calls)}


@contextlib.contextmanager
def _python_calls(calls: list, counting: bool):
    """Appends one entry to `calls` per Python function call while the block runs (when `counting`)."""
    if counting:
        sys.setprofile(lambda frame, event, arg: calls.append(1) if event == "call" else None)
    try:
        yield
    finally:
        sys.setprofile(None)


def run_zero3_engine(engine: str, steps: int) -> dict:
    env = child_env(RANK="0", WORLD_SIZE="1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    worker = [sys.executable, "-m", "tools.bench.scale", "zero3-host", "--worker", engine, "--steps", str(steps)]
    done = subprocess.run(worker, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"ZeRO-{engine} worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def zero3_summary(result: dict) -> dict:
    """Medians, p90 and the forward/canary correlation over the steps after ZERO3_WARMUP."""
    forward, canary = result["forward_cpu_ms_each"][ZERO3_WARMUP:], result["canary_ms_each"][ZERO3_WARMUP:]
    return {"forward_cpu_ms_median": statistics.median(forward), "forward_cpu_ms_p90": _quantile(forward, 0.9),
            "canary_ms_median": statistics.median(canary), "canary_ms_p90": _quantile(canary, 0.9),
            "correlation": _correlation(forward, canary)}


def _correlation(first: list, second: list):
    """Pearson's r, or None where it is undefined (fewer than 3 steps, or a constant series)."""
    try:
        return statistics.correlation(first, second) if len(first) > 2 else None
    except statistics.StatisticsError:
        return None


def _quantile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def zero3_table(results: list) -> str:
    rows = [[f"ZeRO-{r['engine']}", f"{r['summary']['forward_cpu_ms_median']:.2f}",
             f"{r['summary']['forward_cpu_ms_p90']:.2f}", f"{r['forward_python_calls']:,}",
             f"{r['summary']['canary_ms_median']:.3f}", f"{r['summary']['canary_ms_p90']:.3f}",
             fmt(r["summary"]["correlation"], ".2f")] for r in results]
    return markdown_table(["engine", "forward CPU ms, median", "p90", "Python calls a forward", "canary ms, median",
                           "p90", "forward-canary correlation"], rows)


def zero3_host_main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="the host work ZeRO-3 adds to a draft's forward (CPU)")
    parser.add_argument("--steps", type=int, default=300, help=f"steps per engine (the first {ZERO3_WARMUP} not "
                                                                "counted)")
    parser.add_argument("--engines", default=",".join(ZERO3_ENGINES),
                        help="2: ZeRO-2; 3: ZeRO-3, the draft's weights partitioned; 3-whole: ZeRO-3, whole weights "
                             "and no module hooks (train.zero3_persist)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", choices=ZERO3_ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(zero3_worker(args.worker, args.steps)))
        return {}
    if args.out is None or args.steps <= ZERO3_WARMUP:
        parser.error(f"--out is required and --steps must exceed {ZERO3_WARMUP}")
    engines = args.engines.split(",")
    if not set(engines) <= set(ZERO3_ENGINES):
        parser.error(f"--engines {args.engines}: each one of {', '.join(ZERO3_ENGINES)}")
    results = []
    for engine in engines:
        result = run_zero3_engine(engine, args.steps)
        results.append({**result, "summary": zero3_summary(result)})
    report = {"machine": machine("cpu"), "steps": args.steps, "warmup_steps": ZERO3_WARMUP, "results": results}
    return finish(zero3_table(results), args.out, report, "zero3_host")


def random_target(layers: int, hidden: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    import torch

    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _counting(linear, calls: list):
    def counted(input, weight, bias=None):
        calls.append(1)
        return linear(input, weight, bias)
    return counted


def measure_target_linear(steps: int, layers: int, hidden: int, tokens: int) -> dict:
    """-> {variant: {"cpu_ms_each": [...], "deepspeed_linear_calls": per forward}}."""
    import torch
    import torch.nn.functional as F
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    from specdraft.targets.features import run_decoder, capture_features, causal_attention

    model = random_target(layers, hidden)
    ids = torch.randint(0, 512, (1, tokens), generator=torch.Generator().manual_seed(0))  # [1, T]
    calls: list = []
    F.linear = _counting(zero3_linear_wrap, calls)  # as ZeRO-3 leaves the process

    def deepspeed():  # the target's forward through DeepSpeed's Function, without torch_linear
        with torch.no_grad(), causal_attention(model):
            run_decoder(model.get_decoder(), ids, None, None, [0, 2, layers // 2, layers - 3])

    def torch_linear():
        capture_features(model, ids, None, [2, layers // 2, layers - 3])

    variants = {"deepspeed": deepspeed, "torch_linear": torch_linear}
    results = {name: {"cpu_ms_each": [], "deepspeed_linear_calls": 0} for name in variants}
    try:
        for step in range(steps):
            for name, forward in variants.items():
                calls.clear()
                started = time.thread_time()
                forward()
                results[name]["cpu_ms_each"].append(1e3 * (time.thread_time() - started))
                results[name]["deepspeed_linear_calls"] = len(calls)
    finally:
        F.linear = torch._C._nn.linear
    return results


def target_linear_table(results: dict) -> str:
    return markdown_table(["variant", "CPU ms a forward, median", "p90", "DeepSpeed linear calls"],
                          [[name, f"{r['cpu_ms_median']:.2f}", f"{r['cpu_ms_p90']:.2f}", r["deepspeed_linear_calls"]]
                           for name, r in results.items()])


def target_linear_main(argv=None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description="the frozen target's host time under DeepSpeed's linear and "
                                                 "under torch_linear (CPU)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10, help="forwards of each variant left out of the statistics")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps must exceed --warmup ({args.warmup})")
    torch.set_num_threads(1)
    results = measure_target_linear(args.steps, args.layers, args.hidden, args.tokens)
    for result in results.values():
        timed = sorted(result["cpu_ms_each"][args.warmup:])
        result["cpu_ms_median"] = statistics.median(timed)
        result["cpu_ms_p90"] = _quantile(timed, 0.9)
    report = {**vars(args), "out": str(args.out), "machine": machine("cpu"), "results": results}
    return finish(target_linear_table(results), args.out, report, "target_linear")
