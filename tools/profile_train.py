"""Where the time of a `specdraft train` step goes: the recipe's own run, with a few steps under torch.profiler.

The run is `specdraft train RECIPE [overrides]` itself (same data, features, draft, strategy), stopped after
--warmup + --steps optimizer steps with no validation. The profiled steps give:
  - the wall time of a step and the device's busy time in it (the sum of kernel times): a step whose wall time
    is well above its busy time is bound by the host (Python, launches, syncs), not by the GPU;
  - the ops with the most device time, and those with the most host time (self time, per step);
  - the host's waits for the device per step (synchronizations, copies to the host such as `.item()`), after
    each of which the device runs dry until the host launches again.
Lightning runs the forward and backward inside the optimizer's step (its closure), so the optimizer's own range
(`Optimizer.step#AdamW.step`) covers the whole step: read the op tables, not that range.

    python -m tools.profile_train recipes/eagle3_smollm2.yaml target.path=... --warmup 30 --steps 10 --out runs/prof

Writes OUT/profile_train.json (and OUT/trace.json, a Chrome trace, with --trace). Prints the tables. On several
GPUs every rank profiles its own steps: rank R > 0 writes profile_train_rankR.json (and trace_rankR.json).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
from lightning.pytorch.callbacks import Callback
from torch.profiler import ProfilerActivity, profile

from specdraft.core.io import write_json
from specdraft.train.profiling import op_report, print_op_tables


class ProfileSteps(Callback):
    """Profiles optimizer steps warmup+1 .. warmup+steps of the fit (batches, with no gradient accumulation)."""

    def __init__(self, warmup: int, steps: int, trace: Optional[Path] = None):
        self.warmup, self.steps, self.trace = warmup, steps, trace
        self.rank, self.world_size = 0, 1
        self.profiler: Optional[profile] = None
        self.started = self.wall_seconds = None

    def _sync(self, pl_module):
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def setup(self, trainer, pl_module, stage):
        self.rank, self.world_size = trainer.global_rank, trainer.world_size

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.warmup and self.profiler is None:
            self._sync(pl_module)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
            self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.profiler is not None and self.wall_seconds is None \
                and trainer.global_step >= self.warmup + self.steps:
            self._sync(pl_module)
            self.wall_seconds = time.perf_counter() - self.started
            self.profiler.__exit__(None, None, None)
            if self.trace is not None:
                self.profiler.export_chrome_trace(str(rank_path(self.trace, self.rank)))

    def report(self, top: int) -> Dict:
        if self.wall_seconds is None:
            raise SystemExit(f"the run ended before step {self.warmup + self.steps}: raise train.max_steps "
                             f"or lower --warmup/--steps")
        return {"steps": self.steps, "step_ms": self.wall_seconds * 1e3 / self.steps,
                **op_report(self.profiler, self.steps, top)}


class SyncWaits:
    """The host's seconds inside explicit CUDA synchronizations (an event's, a stream's, the device's), summed over
    every thread since `install`. The driver spins in them by default, so a waiting host shows CPU time as a
    working one does: this is what tells them apart. Copies to the host (`.item()`, `.cpu()`) are not counted."""

    seconds = 0.0
    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed or not torch.cuda.is_available():
            return
        for owner in (torch.cuda.Event, torch.cuda.Stream, torch.cuda):
            setattr(owner, "synchronize", cls.timed(owner.synchronize))
        cls.installed = True

    @classmethod
    def timed(cls, call):
        @functools.wraps(call)
        def timed_call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                cls.seconds += time.perf_counter() - started
        return timed_call


_device_synchronize = torch.cuda.synchronize  # PhaseTimes' own step-end sync, not counted by SyncWaits


class PhaseTimes(Callback):
    """No profiler: the host's time in each phase of optimizer steps warmup+1 .. warmup+steps on this rank, the
    device synchronized at each step's end. forward: the batch's start to its loss; backward: the backward call
    (under DeepSpeed its gradient reduction too); step: the rest (the optimizer, DeepSpeed's partition updates).
    Ranks in lockstep wait for each other inside collectives: the phase that grows on one rank is where it waits.
    Each phase's CPU time of the main thread beside its wall time tells a busy host (CPU near wall; slower when
    contended) from one that waits for its device or the other ranks (CPU well under wall, unless it spins). The
    time inside CUDA synchronizations (SyncWaits) tells a spinning wait from work."""

    PHASES = ("forward", "backward", "step")
    MEASURES = {"ms": 1e3, "cpu_ms": 1e3, "preemptions": 1, "wait_ms": 1e3, "sys_ms": 1e3, "page_faults": 1,
                "cuda_mallocs": 1, "cuda_frees": 1, "alloc_retries": 1}
    """Per phase: wall ms; the main thread's CPU ms; its involuntary context switches (the OS took its core); ms
    inside CUDA synchronizations (any thread); the main thread's CPU ms in the kernel (part of its CPU ms) and its
    page faults (memory the allocator maps and touches anew); the caching allocator's cudaMalloc and cudaFree calls
    (each costs host time, and a cudaFree waits for the whole device) and its retries (an allocation that failed,
    freed the cache and tried again). The allocator's counts are 0 off CUDA."""

    def __init__(self, warmup: int, steps: int, split_forward: bool = False):
        """split_forward: the forward timed as two phases, `target` (the frozen target's features, the device
        synchronized at their end) and `draft` (the rest, to the loss). The sync takes away the overlap of the
        target's device work with the draft's host work, so the step is slower than unsplit: it shows which part
        the host limits, not the step's time."""
        self.warmup, self.steps = warmup, steps
        self.phases = ("target", "draft", "backward", "step") if split_forward else self.PHASES
        self.rank, self.world_size = 0, 1
        self.marks: List[Tuple[float, ...]] = []  # each measure's running total (MEASURES order) at each phase edge
        self.rows: List[List[Tuple[float, ...]]] = []  # [step][phase] their differences
        self.extras: List[Tuple[float, float]] = []  # per timed step: (start, epoch seconds; host_canary_ms)
        self.batch_extras = (0.0, 0.0)

    def setup(self, trainer, pl_module, stage):
        self.rank, self.world_size = trainer.global_rank, trainer.world_size
        SyncWaits.install()

    def on_train_start(self, trainer, pl_module):
        if "target" in self.phases:  # after the module's setup, which may build the features' target
            pl_module.features = _MarkAfter(pl_module.features, lambda: self._mark(pl_module))

    def _mark(self, pl_module) -> None:
        if pl_module.device.type == "cuda":
            _device_synchronize(pl_module.device)
        self.marks.append(self._now())

    @staticmethod
    def _now() -> Tuple[float, ...]:
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        return (time.perf_counter(), time.thread_time(), usage.ru_nivcsw, SyncWaits.seconds, usage.ru_stime,
                usage.ru_minflt + usage.ru_majflt, *allocator_counts())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch_extras = (time.time(), host_canary_ms())
        self.marks = [self._now()]

    def on_before_backward(self, trainer, pl_module, loss):
        self.marks.append(self._now())

    def on_after_backward(self, trainer, pl_module):
        self.marks.append(self._now())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._mark(pl_module)
        if self.warmup < trainer.global_step <= self.warmup + self.steps and len(self.marks) == len(self.phases) + 1:
            self.rows.append([tuple(b - a for a, b in zip(earlier, later))
                              for earlier, later in zip(self.marks, self.marks[1:])])
            self.extras.append(self.batch_extras)

    def report(self, top: int) -> Dict:
        """-> step_ms (median); each step's start (epoch seconds, to align with samplers such as py-spy) and host
        canary (host_canary_ms) before it; for each measure M of MEASURES, phase_M_each {phase: per step} and
        phase_M_median {phase: median}."""
        if len(self.rows) < self.steps:
            raise SystemExit(f"{len(self.rows)} of {self.steps} steps timed: raise train.max_steps")
        steps_ms = [1e3 * sum(phase[0] for phase in row) for row in self.rows]
        canary_ms = [canary for _, canary in self.extras]
        report = {"steps": self.steps, "step_ms": statistics.median(steps_ms), "step_ms_each": steps_ms,
                  "step_started_unix_each": [started for started, _ in self.extras],
                  "canary_ms_each": canary_ms, "canary_ms_median": statistics.median(canary_ms)}
        for index, (measure, scale) in enumerate(self.MEASURES.items()):
            each = {name: [scale * row[i][index] for row in self.rows] for i, name in enumerate(self.phases)}
            report[f"phase_{measure}_each"] = each
            report[f"phase_{measure}_median"] = {name: statistics.median(values) for name, values in each.items()}
        return report


class _MarkAfter:
    """The module's features (`features(batch)`), then `mark()`; anything else reads through to them."""

    def __init__(self, features, mark: Callable[[], None]):
        self.features, self.mark = features, mark

    def __call__(self, batch):
        features = self.features(batch)
        self.mark()
        return features

    def __getattr__(self, name):
        return getattr(self.features, name)


def allocator_counts() -> Tuple[int, int, int]:
    """The CUDA caching allocator's running totals: (cudaMalloc calls, cudaFree calls, allocation retries); zeros
    without CUDA."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0, 0, 0
    stats = torch.cuda.memory_stats()
    return stats.get("num_device_alloc", 0), stats.get("num_device_free", 0), stats.get("num_alloc_retries", 0)


def host_canary_ms() -> float:
    """The wall ms of a fixed piece of pure-Python work (about 1 ms): the host's own pace at this moment, whatever
    the step does. A host-bound forward that slows in step with it runs on a host that is slower at times (its
    core shared with another guest's thread, its clock lower), not one that does more work."""
    started = time.perf_counter()
    sum(range(50_000))
    return 1e3 * (time.perf_counter() - started)


CU_CTX_SCHED_BLOCKING_SYNC = 0x04


class BlockingSync(Callback):
    """An experiment for ranks that wait for each other (issue 7): each rank's host thread sleeps while it waits
    for its GPU instead of spinning on its core (the driver spins when there are fewer contexts than cores). The
    rank's device gets CU_CTX_SCHED_BLOCKING_SYNC; `flags` is what the driver reports afterwards. A waiting rank's
    phase CPU time (--phases) shows whether it took: a spinning wait costs CPU, a sleeping one does not."""

    def __init__(self):
        self.flags: Optional[int] = None

    def setup(self, trainer, pl_module, stage):
        device = trainer.strategy.root_device
        if device.type == "cuda":
            self.flags = set_blocking_sync(device.index or 0)


def set_blocking_sync(device_index: int) -> int:
    """CU_CTX_SCHED_BLOCKING_SYNC on the primary context of CUDA device `device_index` -> its flags afterwards
    (drivers from CUDA 11 take new flags while the context is active)."""
    import ctypes

    driver = ctypes.CDLL("libcuda.so.1")
    device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    calls = {"cuInit": lambda: driver.cuInit(0),
             "cuDeviceGet": lambda: driver.cuDeviceGet(ctypes.byref(device), device_index),
             "cuDevicePrimaryCtxSetFlags_v2": lambda: driver.cuDevicePrimaryCtxSetFlags_v2(device,
                                                                                         CU_CTX_SCHED_BLOCKING_SYNC),
             "cuDevicePrimaryCtxGetState": lambda: driver.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags),
                                                                                     ctypes.byref(active))}
    for name, call in calls.items():
        status = call()
        if status != 0:
            raise RuntimeError(f"{name} failed: CUDA driver status {status}")
    return flags.value


class PinCores(Callback):
    """An experiment for ranks that slow each other (issue 7): each local rank's threads get a disjoint, contiguous
    share of the physical cores this process may use (with their hyperthread siblings), so no rank's main thread
    shares a core with another rank's threads, and its intra-op pool matches its share. `cpus` is this rank's
    CPU list."""

    def __init__(self):
        self.cpus: Optional[List[int]] = None

    def setup(self, trainer, pl_module, stage):
        cores = rank_cores(physical_cores(), trainer.local_rank, trainer.num_devices)
        self.cpus = sorted(cpu for core in cores for cpu in core)
        for thread_id in os.listdir("/proc/self/task"):  # threads started later inherit their creator's set
            try:
                os.sched_setaffinity(int(thread_id), self.cpus)
            except ProcessLookupError:
                pass  # the thread has exited
        torch.set_num_threads(len(cores))


def physical_cores() -> List[List[int]]:
    """The CPUs this process may run on, grouped by physical core (hyperthread siblings together), in order."""
    cores: Dict[Tuple[int, int], List[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = (int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()))
        except (OSError, ValueError):
            key = (0, cpu)  # no topology exposed: each CPU its own core
        cores.setdefault(key, []).append(cpu)
    return sorted(cores.values())


def rank_cores(cores: List[List[int]], local_rank: int, local_ranks: int) -> List[List[int]]:
    """Local rank `local_rank` of `local_ranks`'s physical cores: its contiguous 1/local_ranks of `cores`."""
    if len(cores) < local_ranks:
        raise SystemExit(f"--pin-cores: {len(cores)} physical cores for {local_ranks} ranks on this node")
    share = len(cores) // local_ranks
    return cores[local_rank * share:(local_rank + 1) * share]


def rank_path(path: Path, rank: int) -> Path:
    """`path` for rank 0; NAME_rankR.EXT for the other ranks of a multi-GPU run (each rank profiles itself)."""
    return path if rank == 0 else path.with_name(f"{path.stem}_rank{rank}{path.suffix}")


def print_report(report: Dict) -> None:
    if "phase_ms_median" in report:
        measures = list(PhaseTimes.MEASURES)
        print(f"step {report['step_ms']:.1f} ms (median); per phase, medians of: {' / '.join(measures)}")
        for name in report["phase_ms_median"]:
            print(f"  {name}: " + " / ".join(f"{report[f'phase_{measure}_median'][name]:.1f}" for measure in measures))
        return
    print(f"step {report['step_ms']:.1f} ms wall, device busy {report['device_busy_ms']:.1f} ms "
          f"({100 * report['device_busy_ms'] / report['step_ms']:.0f}%), "
          f"~{report['kernel_launches_per_step']:.0f} kernel launches per step")
    print_op_tables(report)


def main(argv: Optional[List[str]] = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides, as for `specdraft train`")
    parser.add_argument("--warmup", type=int, default=20, help="optimizer steps before profiling")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps profiled")
    parser.add_argument("--top", type=int, default=20, help="rows of each op table")
    parser.add_argument("--trace", action="store_true", help="also write OUT/trace.json (Chrome trace)")
    parser.add_argument("--phases", action="store_true",
                        help="no profiler: each step's host time in forward, backward and the optimizer step, per rank")
    parser.add_argument("--split-forward", action="store_true",
                        help="with --phases: the forward as `target` and `draft`, the device synchronized between them")
    parser.add_argument("--blocking-sync", action="store_true",
                        help="each rank's host sleeps instead of spinning while it waits for its GPU (an experiment)")
    parser.add_argument("--pin-cores", action="store_true",
                        help="each local rank's threads on a disjoint share of the physical cores (an experiment)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.split_forward and not args.phases:
        parser.error("--split-forward splits --phases' forward: add --phases")
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = args.warmup + args.steps
    recipe = load_recipe(args.recipe, [*args.overrides, f"train.max_steps={total}",
                                       f"train.val_every_steps={total + 1}", "train.accumulate_grad_batches=1",
                                       f"train.output_dir={out / 'train'}"])
    profiler = PhaseTimes(args.warmup, args.steps, args.split_forward) if args.phases \
        else ProfileSteps(args.warmup, args.steps, out / "trace.json" if args.trace else None)
    blocking = BlockingSync() if args.blocking_sync else None
    pinning = PinCores() if args.pin_cores else None
    summary = run_train(recipe, extra_callbacks=[callback for callback in (profiler, blocking, pinning) if callback])
    report = {"recipe": args.recipe, "overrides": args.overrides, "train_summary": summary,
              "context_flags": blocking.flags if blocking else None, "cpus": pinning.cpus if pinning else None,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "rank": profiler.rank, "world_size": profiler.world_size, **profiler.report(args.top)}
    print(f"run: {json.dumps(summary)}")
    print(f"rank {profiler.rank} of {profiler.world_size}")
    print_report(report)
    write_json(rank_path(out / "profile_train.json", profiler.rank), report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
