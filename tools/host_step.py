"""The host's share of a `specdraft train` step under DeepSpeed ZeRO-2, measured on the CPU with a tiny target.

On one GPU with no host syncs a step lasts as long as the longer of the device's work and the host's: each
millisecond the host spends outside the model (Lightning's loop and hooks, DeepSpeed's engine, the next batch)
counts once the host is the slower of the two. This runs the recipe's own `specdraft train` (ZeRO-2, its
precision, clipping, checkpointing, callbacks) on the CPU, a tiny Llama-shaped random target (the scaling suite's
`tiny`) and synthetic rows, with DeepSpeed on gloo (Lightning lets it run on CUDA only: this process lifts that
check), and times named regions of the steps after --warmup with the wall clock:

    forward          the target's features and the draft's loss (DraftModule._train_loss)
    backward         DeepSpeed's engine.backward: autograd, ZeRO-2's gradient hooks and its reduction epilogue
      grad hooks     ZeRO-2's per-parameter hooks (process_gradients), within backward
      epilogue       ZeRO-2's reduction of the gradient bucket into the partition (_backward_epilogue)
    engine.step      DeepSpeed's step: norm, clip, the optimizer, the bf16 weights copied back
      optimizer      the optimizer's own step within it
    callbacks        every callback hook Lightning dispatches (ours and its own)
    next batch       the data fetcher: sampler, the dataset's rows, collate
    loop rest        the step's wall time less all of the above (Lightning's loop, closure, LR schedule, ...)

    python -m tools.host_step [RECIPE] [KEY=VALUE ...] --warmup 10 --steps 30 [--cprofile OUT.prof]

Prints a markdown table (ms per step) and one JSON line (with `weights`, a digest of the draft's weights after
the timed steps: an A/B of settings that must not change the training compares them). Compute on a CPU is not a
GPU's: read the regions outside the model, which are host work on either.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REGIONS = ("forward", "backward", "grad hooks", "epilogue", "engine.step", "optimizer", "callbacks", "next batch")


class Regions:
    """Wall seconds spent in wrapped functions while `on`."""

    def __init__(self):
        self.seconds, self.on = collections.defaultdict(float), False

    def wrap(self, owner, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started

        setattr(owner, attr, timed)


def deepspeed_on_cpu() -> None:
    """Lightning's DeepSpeed strategy on the CPU (gloo, one rank): its CUDA-only checks lifted."""
    import deepspeed
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from lightning.pytorch.accelerators.cpu import CPUAccelerator
    from lightning.pytorch.strategies import deepspeed as lightning_deepspeed

    from specdraft.train import trainer

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build: plain gloo
    lightning_deepspeed.CUDAAccelerator = CPUAccelerator
    lightning_deepspeed._validate_device_index_selection = lambda devices: None
    set_vars = DeepSpeedEngine._set_distributed_vars

    def _set_distributed_vars(self, args):
        if args is not None and getattr(args, "device_rank", 0) is None:  # a CPU device has no index
            args.device_rank = 0
        return set_vars(self, args)

    strategy = trainer._strategy

    def _strategy(cfg, resume_from, trust_checkpoint=False):
        available = torch.cuda.is_available
        torch.cuda.is_available = lambda: True
        try:
            built = strategy(cfg, resume_from, trust_checkpoint)
        finally:
            torch.cuda.is_available = available
        if not isinstance(built, str):
            built._process_group_backend = "gloo"
        return built

    DeepSpeedEngine._set_distributed_vars = _set_distributed_vars
    trainer._strategy = _strategy
    trainer.lightning_precision = lambda cfg: "bf16-mixed"  # what a GPU run trains in


def wrap_regions(regions: Regions) -> None:
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from lightning.pytorch.loops import fetchers
    from lightning.pytorch.trainer import call

    from specdraft.train.module import DraftModule

    for owner, attr, label in ((DraftModule, "_train_loss", "forward"), (DeepSpeedEngine, "backward", "backward"),
                               (DeepSpeedZeroOptimizer, "process_gradients", "grad hooks"),
                               (DeepSpeedEngine, "_backward_epilogue", "epilogue"),
                               (DeepSpeedEngine, "step", "engine.step"),
                               (DeepSpeedZeroOptimizer, "_optimizer_step", "optimizer"),
                               (call, "_call_callback_hooks", "callbacks"),
                               (fetchers._PrefetchDataFetcher, "__next__", "next batch")):
        regions.wrap(owner, attr, label)


def step_window(regions: Regions, warmup: int, steps: int, profile_to=None):
    """A callback timing optimizer steps warmup+1 .. warmup+steps (and cProfile over them with `profile_to`),
    then stopping the fit."""
    import cProfile

    from lightning.pytorch.callbacks import Callback

    class Window(Callback):
        def __init__(self):
            self.started, self.wall, self.profiler = None, None, cProfile.Profile() if profile_to else None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == warmup and self.started is None:
                self.started, regions.on = time.perf_counter(), True
                if self.profiler:
                    self.profiler.enable()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == warmup + steps and self.wall is None:
                regions.on = False
                if self.profiler:
                    self.profiler.disable()
                    self.profiler.dump_stats(str(profile_to))
                self.wall, trainer.should_stop = time.perf_counter() - self.started, True
                self.weights = weights_digest(pl_module.draft)

    return Window()


def weights_digest(module) -> str:
    """sha256 of the module's parameters' bytes: whether two runs trained the very same weights."""
    import hashlib

    digest = hashlib.sha256()
    for param in module.parameters():
        digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def table(regions: Regions, wall: float, steps: int) -> dict:
    """-> {region: ms per step}, `step` the wall time and `loop rest` what no region holds."""
    ms = {name: regions.seconds.get(name, 0.0) / steps * 1e3 for name in REGIONS}
    ms["step"] = wall / steps * 1e3
    outer = ("forward", "backward", "engine.step", "callbacks", "next batch")
    ms["loop rest"] = ms["step"] - sum(ms[name] for name in outer)
    return ms


def write_data(work: Path) -> None:
    from tools.bench import scale

    shape = scale.CONFIGS["tiny"]
    if not (work / "target" / "config.json").exists():
        (work / "target").mkdir(parents=True, exist_ok=True)
        scale.write_target(work / "target", shape["target"])
        scale.write_rows(work / "data", 64, shape["seq_len"], shape["target"]["vocab_size"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default=str(REPO / "recipes" / "eagle3_llama3.yaml"))
    parser.add_argument("overrides", nargs="*", default=[])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--work", type=Path, help="target, rows and run (default: a temporary directory)")
    parser.add_argument("--cprofile", type=Path, help="also write a cProfile of the timed steps here")
    args = parser.parse_args(argv)
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "OMP_NUM_THREADS": "1"})  # one thread: the CPU's compute stays small beside the host work
    os.environ.setdefault("MASTER_PORT", "29611")
    import torch

    torch.set_num_threads(1)
    deepspeed_on_cpu()
    regions = Regions()
    wrap_regions(regions)
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    work = args.work or Path(tempfile.mkdtemp(prefix="host_step_"))
    write_data(work)
    overrides = [f"target.path={work / 'target'}", "target.random_init=true", f"distill.output_dir={work / 'data'}",
                 "train.devices=1", "data.max_length=128", "method.draft_vocab_size=256",
                 f"train.output_dir={work / 'run'}", f"train.max_steps={args.warmup + args.steps + 10}",
                 "train.strategy=deepspeed_stage_2", *args.overrides]
    window = step_window(regions, args.warmup, args.steps, args.cprofile)
    run_train(load_recipe(args.recipe, overrides, False), extra_callbacks=[window])
    ms = table(regions, window.wall, args.steps)
    print("\n| region | ms per step |\n|---|---|")
    for name, value in ms.items():
        print(f"| {name} | {value:.3f} |")
    print(json.dumps({**ms, "weights": window.weights}))
    return {**ms, "weights": window.weights}


if __name__ == "__main__":
    main()
