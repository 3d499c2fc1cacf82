"""How much host work DeepSpeed's ZeRO-3 adds to a draft's forward, and whether the host's own pace explains its slow
stretches (issue 7). CPU only.

Each stage runs in a process of its own: one DeepSpeed rank (gloo) trains a tiny EAGLE-3 draft (7 TTT unrolls)
under the ZeRO-2 or the ZeRO-3 engine, on one fixed random batch. Before each step, a fixed piece of pure-Python
work (tools/profile_train.host_canary_ms) times the host's own pace. A forward that slows whenever the canary
does is bound by a host whose speed varies, not by more work.

    python tools/bench_zero3_host.py --steps 300 --out runs/zero3_host

Prints, per stage, the forward's main-thread CPU ms (median, p90), the canary's ms, and their correlation over
the steps. Writes OUT/bench_zero3_host.json with every step's figures.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specdraft.core.io import write_json

REPO = Path(__file__).resolve().parents[1]
WARMUP = 10  # steps left out of the statistics (DeepSpeed records its parameter trace in the first)


def worker(stage: int, steps: int) -> dict:
    """One rank, `steps` steps under ZeRO-`stage` -> every step's forward CPU ms and canary ms."""
    import torch

    sys.path.insert(0, str(REPO / "tools"))
    from profile_train import host_canary_ms

    from specdraft.core.types import DraftContext, TargetInfo
    from tests import zero_init_run
    from tests.tiny import tiny_llama_config

    torch.set_num_threads(1)
    zero_init_run._init()
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    info = TargetInfo.from_hf_config(tiny_llama_config(), "tiny")
    ctx = DraftContext(target=info, token_counts=torch.arange(info.vocab_size))
    spec, cfg, plain, partitioned = zero_init_run._plain_and_sharded(
        "eagle3", {"ttt_steps": 7, "draft_vocab_size": 256}, ctx, {**config, "zero_optimization": {"stage": 3}})
    draft = partitioned if stage == 3 else plain
    engine, *_ = deepspeed.initialize(model=zero_init_run._LossModule(spec, cfg, draft), config=config,
                                      model_parameters=draft.parameters())
    batch = zero_init_run._random_batch(spec, cfg, info, torch.Generator().manual_seed(0), rows=1)
    forward_ms, canary_ms = [], []
    for _ in range(steps):
        canary_ms.append(host_canary_ms())
        started = time.thread_time()
        loss = engine(batch)
        forward_ms.append(1e3 * (time.thread_time() - started))
        engine.backward(loss)
        engine.step()
    return {"stage": stage, "forward_cpu_ms_each": forward_ms, "canary_ms_each": canary_ms}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_stage(stage: int, steps: int) -> dict:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, __file__, "--worker", str(stage), "--steps", str(steps)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"ZeRO-{stage} worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(result: dict) -> dict:
    """Medians, p90 and the forward/canary correlation over the steps after WARMUP."""
    forward, canary = result["forward_cpu_ms_each"][WARMUP:], result["canary_ms_each"][WARMUP:]
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


def table(results: list) -> str:
    lines = [f"{'stage':>6} {'forward CPU ms':>15} {'p90':>7} {'canary ms':>10} {'p90':>7} {'correlation':>12}"]
    for result in results:
        stats = result["summary"]
        correlation = "-" if stats["correlation"] is None else f"{stats['correlation']:.2f}"
        lines.append(f"{result['stage']:>6} {stats['forward_cpu_ms_median']:>15.2f} {stats['forward_cpu_ms_p90']:>7.2f} "
                     f"{stats['canary_ms_median']:>10.3f} {stats['canary_ms_p90']:>7.3f} {correlation:>12}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help=f"steps per stage (the first {WARMUP} not counted)")
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.steps)))
        return {}
    if args.out is None or args.steps <= WARMUP:
        parser.error(f"--out is required and --steps must exceed {WARMUP}")
    results = []
    for stage in (int(s) for s in args.stages.split(",")):
        result = run_stage(stage, args.steps)
        results.append({**result, "summary": summary(result)})
    print(table(results))
    report = {"steps": args.steps, "warmup_steps": WARMUP, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "bench_zero3_host.json", report)
    print(f"-> {args.out / 'bench_zero3_host.json'}")
    return report


if __name__ == "__main__":
    main()
