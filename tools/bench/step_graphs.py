"""Step-graphs suite: a small draft's whole training step, eager and as a CUDA graph (train.cuda_graphs), alone on
one GPU, at a fixed batch shape.

    python -m tools.bench.step_graphs --out runs/bench                        # SmolLM2 head, B 16 x T 1024
    python -m tools.bench.step_graphs --seq-lens 512 --out runs/bench/t512    # a shorter padded length
    python -m tools.bench.step_graphs --config tiny --device cpu --out /tmp/bench
    python -m tools.bench.step_graphs cli --out runs/bench                    # the same through `specdraft train`
    python -m tools.bench.step_graphs cli --config tiny --device cpu --recipe recipes/smoke/eagle3_smollm2.yaml \
        --seq-len 64 --batch 2 --out /tmp/bench

One step is what `specdraft train` runs for a micro-batch (without Lightning): the frozen target's forward (bf16,
online features), the EAGLE-3 head's 7 TTT steps forward and backward, gradient clipping at 0.5, the optimizer
and the LR schedule. The target is tools/bench/train.py's --config (default smollm2: SmolLM2-135M's shapes,
hidden 576, 30 layers, 9 heads, 3 KV heads, MLP 1536, vocabulary 49152; draft vocabulary 8192) with random
weights; the batch is --batch rows (default 16, the defaults suite's micro-batch) of exactly T random tokens,
every token an answer token: data.max_length 1024 of recipes/eagle3_smollm2.yaml padded to, one shape.

Rows (--rows, in this order at each T):
  plain         the settings before the fast defaults: train.compile=false, activation checkpointing none,
                PyTorch's AdamW (foreach), eager steps
  defaults      `specdraft train` before train.cuda_graphs: compile auto, swiglu, optimizer auto (the fused 8-bit
                AdamW on CUDA), eager steps
  graphs        defaults with train.cuda_graphs: the loss's forward and backward (the target's forward
                included) captured once and replayed (specdraft.train.graphs.StepGraphs); optimizer eager
  graphs-eager  graphs without torch.compile (what compiling still buys inside a graph)
  graphs-draft  graphs with the target's forward eager, outside the graph: the draft's loss alone replayed (what
                the target's share of the launches is; a fallback should the whole step not capture)
On a CPU the graph rows run StepGraphs' bookkeeping with `rerun_capture` (no graph: the same figures as eager).

Per row: steps/s and tokens/s over --steps timed steps run back to back (after --warmup untimed ones, which
compile and capture), the ratios to `plain` and to `defaults` of this run, and from --profile more steps under
torch.profiler the host's launch calls per step (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch,
cudaMemcpyAsync, ...), the kernels the device ran, the host's waits for it (syncs, reads back) and its busy
share of the step. Graph rows also compare one replay with the eager loss and gradients of the same batch and
weights (relative differences: bf16 autocast in both). A row that fails reports its error and the next row
runs. Writes OUT/step_graphs.json (after every row).

`cli`: `specdraft train RECIPE` itself (Lightning, the data loader, the recipe's settings) in a process per row,
on tools/bench/scale.py's random target of the same shapes (target.random_init) and --rows synthetic distilled
rows of exactly --seq-len tokens, train.micro_batch_size=--batch, train.devices=1, --warmup + --steps steps and
one validation at the end. Rows: plain, defaults (both with train.cuda_graphs=false) and graphs
(train.cuda_graphs=true: a capture that fails is the row's error). steps/s and tokens/s from RUN/logs/
step_times.csv after the warm-up steps, the ratio to plain (or defaults) of this call. OUT/step_graphs_cli.json;
each process's log in OUT/logs.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from pathlib import Path

from tools.bench import scale, train_rows
from tools.bench.suite import REPO, finish, fmt, machine, markdown_table, run_parts, write_report

import torch

from specdraft.config import TrainConfig
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures
from specdraft.layers.compile import compile_enabled
from specdraft.train.features import OnlineFeatures
from specdraft.train.graphs import StepGraphs, cuda_capture, rerun_capture
from specdraft.train.module import build_optimizer, optimizer_choice, warmup_cosine
from specdraft.train.profiling import op_report

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel")
"""Host calls that each put work on the device's queue: what a host-bound step spends its time issuing."""
GOAL = 2.0


@dataclass(frozen=True)
class Setting:
    name: str
    compile: bool
    checkpointing: str
    optimizer: str
    graphs: bool
    draft_only: bool = False
    """The graph holds the draft's loss alone; the target's forward runs eagerly before it."""


SETTINGS = {s.name: s for s in (
    Setting("plain", False, "none", "adamw", False),
    Setting("defaults", True, "swiglu", "auto", False),
    Setting("graphs", True, "swiglu", "auto", True),
    Setting("graphs-eager", False, "swiglu", "auto", True),
    Setting("graphs-draft", True, "swiglu", "auto", True, draft_only=True),
)}


class Step:
    """One setting's draft, optimizer, LR schedule, batch and step function."""

    def __init__(self, bench, setting: Setting, batch_size: int, seq_len: int):
        self.bench, self.compiled = bench, compile_enabled("auto" if setting.compile else "false", bench.device)
        self.cfg = bench.spec.config(ttt_steps=train_rows.TTT_STEPS, draft_vocab_size=bench.draft_vocab)
        counts = torch.randint(0, 1000, (bench.info.vocab_size,))
        ctx = DraftContext(bench.info, counts, activation_checkpointing=setting.checkpointing, compile=self.compiled)
        with torch.device(bench.device):
            self.draft = bench.spec.build(self.cfg, ctx)
        self.params = [param for param in self.draft.parameters() if param.requires_grad]
        train_cfg = TrainConfig(optimizer=setting.optimizer, lr=1e-4, warmup_steps=2, max_steps=1000)
        self.optimizer_name = optimizer_choice(train_cfg, bench.device, self.params)
        self.optimizer = build_optimizer(self.optimizer_name, [{"params": self.params}], lr=1e-4, weight_decay=0.0)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: warmup_cosine(step, train_cfg))
        ids = torch.randint(0, bench.info.vocab_size, (batch_size, seq_len), device=bench.device)
        ones = torch.ones_like(ids)
        self.batch = {"input_ids": ids, "loss_mask": ones, "attention_mask": ones}
        self.features = OnlineFeatures(bench.target, bench.layers)  # compiled or not by compiled_target
        self.draft_only = setting.draft_only
        capture = cuda_capture if bench.cuda else rerun_capture
        graphed = self.draft_loss if setting.draft_only else self.eager_loss
        self.graphs = StepGraphs(graphed, self.params, strict=True, capture=capture) if setting.graphs else None

    def eager_loss(self, batch: Dict):
        features = self.features(batch)
        draft_batch = DraftBatch(batch["input_ids"], batch["loss_mask"], batch["attention_mask"], features)
        return self.bench.spec.loss(self.draft, draft_batch, self.cfg)

    def draft_loss(self, batch: Dict):
        """The loss of a batch that carries the target's features (`with_features`)."""
        features = TargetFeatures(hidden_states=batch["hidden_states"], final_hidden=batch["final_hidden"],
                                  lm_head=self.bench.target.get_output_embeddings().weight)
        draft_batch = DraftBatch(batch["input_ids"], batch["loss_mask"], batch["attention_mask"], features)
        return self.bench.spec.loss(self.draft, draft_batch, self.cfg)

    def with_features(self, batch: Dict) -> Dict:
        """The batch and the target's features of it (its forward, eager, outside any graph)."""
        features = self.features(batch)
        return {**batch, "hidden_states": features.hidden_states, "final_hidden": features.final_hidden}

    def loss(self, batch: Dict):
        """The step's loss: eager, replayed whole, or (draft_only) the target eager and the draft replayed."""
        if self.graphs is None:
            return self.eager_loss(batch)
        return self.graphs(self.with_features(batch) if self.draft_only else batch)

    def step(self) -> None:
        """What Lightning runs for one optimizer step: loss, backward, clipping, optimizer, schedule, zero_grad."""
        with self.bench.autocast():
            result = self.loss(self.batch)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 0.5)
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)

    def replay_check(self) -> Dict[str, float]:
        """One replay against the eager loss and gradients of the same batch and weights: relative differences."""
        with self.bench.autocast():
            eager = self.eager_loss(self.batch)
        eager_grads = torch.autograd.grad(eager.loss, self.params, allow_unused=True)
        with self.bench.autocast():
            replayed = self.loss(self.batch)
        replayed_grads = torch.autograd.grad(replayed.loss, self.params, allow_unused=True)
        grad_delta = max(float((r - e).norm() / e.norm().clamp(min=1e-12))
                         for r, e in zip(replayed_grads, eager_grads) if e is not None)
        loss_delta = float((replayed.loss - eager.loss).detach().abs() / eager.loss.detach().abs().clamp(min=1e-12))
        return {"loss_rel_delta": loss_delta, "grad_rel_delta": grad_delta}


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def timed(step: Step, cuda: bool, warmup: int, steps: int) -> float:
    """Seconds per step over `steps` run back to back (one sync at the end, as a trainer runs them)."""
    for _ in range(warmup):
        step.step()
    _sync(cuda)
    started = time.perf_counter()
    for _ in range(steps):
        step.step()
    _sync(cuda)
    return (time.perf_counter() - started) / steps


def launches(step: Step, cuda: bool, steps: int) -> dict:
    """Host launch calls, device kernels and device busy ms per step, from torch.profiler over `steps` steps."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step.step()
        _sync(cuda)
    report = op_report(profiler, steps, top=5)
    calls = sum(event.count for event in profiler.key_averages() if event.key in LAUNCH_CALLS)
    return {"launch_calls_per_step": calls / steps, "kernels_per_step": report["kernel_launches_per_step"],
            "device_busy_ms": report["device_busy_ms"],
            "host_waits_per_step": sum(report["host_waits_per_step"].values())}


def run_row(bench, setting: Setting, batch_size: int, seq_len: int, args) -> dict:
    result = {"row": setting.name, "seq_len": seq_len, "batch": batch_size, "status": "ok", "graphs": setting.graphs,
              "checkpointing": setting.checkpointing}
    train_rows.free_memory(bench.cuda)
    resident = torch.cuda.memory_allocated() if bench.cuda else 0
    step = None
    try:
        step = Step(bench, setting, batch_size, seq_len)
        result.update(compiled=step.compiled, optimizer=step.optimizer_name)
        with train_rows.compiled_target(bench.target, step.compiled):
            if bench.cuda:
                torch.cuda.reset_peak_memory_stats()
            seconds = timed(step, bench.cuda, args.warmup, args.steps)
            result.update(step_ms=seconds * 1e3, steps_per_s=1 / seconds, tokens_per_s=batch_size * seq_len / seconds,
                          peak_gib_beyond_resident=(torch.cuda.max_memory_allocated() - resident) / 2 ** 30
                          if bench.cuda else None)
            print(f"  {setting.name} T={seq_len}: {result['steps_per_s']:.2f} steps/s, "
                  f"{result['tokens_per_s']:,.0f} tokens/s (then the check and the profile)", flush=True)
            if step.graphs is not None:
                result["captured_graphs"] = len(step.graphs.graphs)
                result.update(_guarded(step.replay_check, "replay_check"))
            if args.profile:
                result.update(_guarded(lambda: launches(step, bench.cuda, args.profile), "profile"))
    except torch.cuda.OutOfMemoryError:
        result["status"] = "OOM"
    except Exception as err:  # a failing row is reported, the others still run
        result["status"] = f"error: {type(err).__name__}: {_first_line(err)}"[:300]
    step = None
    train_rows.free_memory(bench.cuda)
    return result


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [""])[0]


def _guarded(measure, name: str) -> dict:
    """A secondary measurement that may fail on its own (the profiler, the check) without failing its row."""
    try:
        return measure()
    except Exception as err:
        return {f"{name}_error": f"{type(err).__name__}: {_first_line(err)}"[:200]}


def add_ratios(results: List[dict], busy: bool = True) -> None:
    """Each row's steps/s over plain's and over defaults' at the same T (this run), and its device busy share of
    the step."""
    for base_row in ("plain", "defaults"):
        base = {r["seq_len"]: r["steps_per_s"] for r in results if r["row"] == base_row and r["status"] == "ok"}
        for r in results:
            ok = r["status"] == "ok" and base.get(r["seq_len"]) and r.get("steps_per_s")
            r[f"vs_{base_row}"] = r["steps_per_s"] / base[r["seq_len"]] if ok else None
    for r in results if busy else []:
        busy_ms = r.get("device_busy_ms")
        r["device_busy_share"] = busy_ms / r["step_ms"] if busy_ms and r.get("step_ms") else None


def table(report: dict) -> str:
    rows = []
    for r in report["rows"]:
        check = f"{r['loss_rel_delta']:.1e} / {r['grad_rel_delta']:.1e}" if "loss_rel_delta" in r else \
            r.get("replay_check_error", "")[:60]
        rows.append([r["row"], r["seq_len"], r["status"][:120], fmt(r.get("steps_per_s"), ".2f"),
                     fmt(r.get("tokens_per_s"), ",.0f"), fmt(r.get("step_ms"), ".1f"),
                     *(fmt(r.get(key), ".2f") + ("x" if r.get(key) else "") for key in ("vs_plain", "vs_defaults")),
                     fmt(r.get("launch_calls_per_step"), ".0f"), fmt(r.get("kernels_per_step"), ".0f"),
                     fmt(r.get("host_waits_per_step"), "g"),
                     fmt(None if r.get("device_busy_share") is None else 100 * r["device_busy_share"], ".0f"),
                     fmt(r.get("peak_gib_beyond_resident"), ".2f"), check])
    head = (f"{report['machine']}, torch {report['torch']}, {report['config']} target, batch {report['batch']} rows "
            f"x T tokens, {report['ttt_steps']} TTT steps, draft vocabulary {report['draft_vocab']}\n\n")
    return head + markdown_table(["row", "T", "status", "steps/s", "tokens/s", "step ms", "x plain", "x defaults",
                                  "launch calls", "kernels", "host waits", "device busy %", "GiB beyond weights",
                                  "replay vs eager: loss / grad rel. diff"], rows) + "\n\n" + goal_line(report)


def goal_line(report: dict) -> str:
    best = [r for r in report["rows"] if r["graphs"] and r.get("vs_plain")]
    if not best:
        return f"goal (a graph row >= {GOAL:g}x plain's steps/s): no graph row ran"
    top = max(best, key=lambda r: r["vs_plain"])
    verdict = "met" if top["vs_plain"] >= GOAL else "not met"
    against_defaults = f", {top['vs_defaults']:.2f}x defaults'" if top.get("vs_defaults") else ""
    return f"goal (a graph row >= {GOAL:g}x plain's steps/s): {verdict}: {top['row']} T={top['seq_len']} " \
           f"{top['vs_plain']:.2f}x plain's{against_defaults}"


def run(args) -> dict:
    """Every row at every length; the report is rewritten after each row (a crash keeps the rows before it)."""
    started = time.perf_counter()
    bench = train_rows.Bench(train_rows.CONFIGS[args.config], args.device)
    report = {"machine": machine(args.device), "torch": torch.__version__, "config": args.config,
              "batch": args.batch, "ttt_steps": train_rows.TTT_STEPS, "draft_vocab": bench.draft_vocab,
              "warmup": args.warmup, "steps": args.steps, "rows": []}
    for seq_len in args.seq_lens or train_rows.CONFIGS[args.config]["seq_lens"]:
        if bench.cuda:
            torch._dynamo.reset()  # each length compiles afresh, as a run of that length would
        for name in args.rows:
            report["rows"].append(run_row(bench, SETTINGS[name], args.batch, seq_len, args))
            add_ratios(report["rows"])
            report["seconds"] = time.perf_counter() - started
            write_report(args.out, report, "step_graphs")
            print(f"[{report['seconds']:6.1f} s] {name} T={seq_len}: {report['rows'][-1]['status']}", flush=True)
    return report


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description="a small draft's training step, eager and as a CUDA graph")
    parser.add_argument("--config", choices=sorted(train_rows.CONFIGS), default="smollm2")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-lens", type=int, nargs="+", help="default: the config's (1024 for smollm2)")
    parser.add_argument("--batch", type=int, default=16, help="rows per micro-batch")
    parser.add_argument("--rows", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps (compiles; a graph row's capture)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row")
    parser.add_argument("--profile", type=int, default=2, metavar="STEPS", help="profiled steps per row (0: none)")
    parser.add_argument("--out", default="runs/bench", help="a directory (OUT/step_graphs.json) or a .json path")
    args = parser.parse_args(argv)
    if args.warmup < 3 and any(SETTINGS[name].graphs for name in args.rows):
        parser.error("--warmup must be at least 3 for graph rows (2 eager steps, then the capture)")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    if args.device == "cpu":
        torch.set_num_threads(1)
    try:
        report = run(args)
    finally:
        torch.set_num_threads(threads)
    return finish(table(report), args.out, report, "step_graphs")


CLI_OVERRIDES = {"plain": ["train.compile=false", "train.activation_checkpointing=none", "train.optimizer=adamw",
                           "train.cuda_graphs=false"],
                 "defaults": ["train.cuda_graphs=false"],
                 "graphs": ["train.cuda_graphs=true"]}


def cli_argv(args, name: str, work: Path) -> list:
    from specdraft.recipes import load_recipe

    steps = args.warmup + args.steps
    where = [f"target.path={work / 'target'}", "target.random_init=true", f"distill.output_dir={work / 'data'}",
             f"train.output_dir={work / 'runs' / name}", f"train.max_steps={steps}", f"train.val_every_steps={steps}",
             f"train.micro_batch_size={args.batch}", "train.devices=1", "train.log_every_steps=5",
             "train.accumulate_grad_batches=1"]
    if load_recipe(args.recipe).data.max_length < args.seq_len:
        where.append(f"data.max_length={args.seq_len}")
    return [sys.executable, "-m", "specdraft.cli", "train", str(args.recipe), *where, *CLI_OVERRIDES[name]]


def measure_cli(args, name: str, work: Path) -> dict:
    """One `specdraft train` row -> steps/s and tokens/s after the warm-up steps, or its failure."""
    from specdraft.train.timing import read_step_times

    result = {"row": name, "overrides": CLI_OVERRIDES[name], "status": "ok", "seq_len": args.seq_len}
    log_path = args.out / "logs" / f"cli-{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        try:
            code = scale.run_process_group(cli_argv(args, name, work), scale.train_env(args.device), log,
                                           args.timeout)
        except subprocess.TimeoutExpired:
            return {**result, "status": f"timeout after {args.timeout} s"}
    if code != 0:
        last_lines = " / ".join(scale.log_tail(log_path, 2).splitlines())
        return {**result, "status": f"error: exit {code}: {last_lines[-300:]}"}
    rows = [row for row in read_step_times(work / "runs" / name / "logs" / "step_times.csv") if row[0] >= args.warmup]
    if len(rows) < 2:
        return {**result, "status": "error: too few logged steps after the warm-up"}
    (step0, seconds0, tokens0), (step1, seconds1, tokens1) = rows[0], rows[-1]
    return {**result, "steps_per_s": (step1 - step0) / (seconds1 - seconds0),
            "tokens_per_s": (tokens1 - tokens0) / (seconds1 - seconds0)}


def cli_table(report: dict) -> str:
    rows = [[r["row"], r["status"][:160], fmt(r.get("steps_per_s"), ".2f"), fmt(r.get("tokens_per_s"), ",.0f"),
             *(fmt(r.get(key), ".2f") + ("x" if r.get(key) else "") for key in ("vs_plain", "vs_defaults"))]
            for r in report["rows"]]
    return (f"{report['machine']}, `specdraft train {report['recipe']}`, {report['config']} target (random), "
            f"micro-batch {report['batch']} x {report['seq_len']} tokens, steps after {report['warmup']}\n\n"
            + markdown_table(["row", "status", "steps/s", "tokens/s", "x plain", "x defaults"], rows))


def cli_main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description="`specdraft train` with and without train.cuda_graphs")
    parser.add_argument("--config", choices=("smollm2", "tiny"), default="smollm2", help="tools/bench/scale.py's")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "eagle3_smollm2.yaml")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rows", nargs="+", choices=list(CLI_OVERRIDES), default=["defaults", "graphs"])
    parser.add_argument("--data-rows", type=int, default=64, help="synthetic distilled rows (cycled)")
    parser.add_argument("--warmup", type=int, default=20, help="steps not timed (compiles, the capture)")
    parser.add_argument("--steps", type=int, default=40, help="steps timed")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per process")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    shape = scale.CONFIGS[args.config]["target"]
    work = args.out / "work"
    scale.write_target(work / "target", shape)
    scale.write_rows(work / "data", args.data_rows, args.seq_len, shape["vocab_size"])
    report = {"machine": machine(args.device), "recipe": str(args.recipe), "config": args.config, "batch": args.batch,
              "seq_len": args.seq_len, "warmup": args.warmup, "steps": args.steps, "rows": []}
    for name in args.rows:
        report["rows"].append(measure_cli(args, name, work))
        print(f"cli {name}: {report['rows'][-1]['status'][:200]}", flush=True)
    add_ratios(report["rows"], busy=False)
    return finish(cli_table(report), args.out, report, "step_graphs_cli")


if __name__ == "__main__":
    run_parts({"step": main, "cli": cli_main})
