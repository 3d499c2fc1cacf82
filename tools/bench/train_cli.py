"""The `cli` row of the scaling suite: `specdraft train` with a shipped recipe's own settings beside the training
harness's best row (tools/bench/train.py), in one call, each in a process of its own, on one GPU, at
Llama-3.1-8B shapes with random weights (the scaling suite's target and synthetic rows).

    python -m tools.bench.scale cli --out OUT                      # recipes/eagle3_llama3.yaml, T 2048 and 8192
    python -m tools.bench.scale cli --seq-lens 2048 --out OUT --variant \\
        syncs:train.deepspeed.zero_optimization.overlap_comm=true,train.deepspeed.bf16.check_grad_overflow=true
    python -m tools.bench.scale cli --seq-lens 2048 --profile 5 --out OUT     # and where each step's time goes
    python -m tools.bench.scale cli --config tiny --device cpu --recipe recipes/smoke/eagle3_smollm2.yaml \\
        --seq-lens 64 --out DIR                                              # the path, on a CPU
    python -m tools.bench.scale cli --lengths 2048 16384 32768 65536 --window 2048 --out OUT   # long sequences,
        # each length with and without LongSpec's window (method.attention_window, 4 sinks)
    python -m tools.bench.scale cli --lengths 32768 --window 2048 --log-every 2 --warmup 4 --steps 4 \
        --harness-steps 3 --out OUT                                           # the same rows, few steps timed

Rows, at each length T of --seq-lens:
  harness   tools/bench/train.py's --harness-row (default ours-swiglu-8bit-fused: compiled, swiglu checkpointing,
            the fused 8-bit AdamW; one sequence of T tokens a step, no Lightning), all lengths in one process
  cli       `specdraft train RECIPE` on synthetic distilled rows of T tokens, with the recipe's settings but for
            where things are: target.path and target.random_init (the random target), distill.output_dir (the
            rows), train.output_dir, train.max_steps (--warmup + --steps), train.devices=1, and
            data.max_length=T where T is not the recipe's (its rows would be cut to it)
  cli-NAME  cli with a --variant's overrides on top (an A/B in the same call)
  cli-window  with --window W: cli with method.attention_window=W and method.attention_sinks=--sinks (LongSpec's
            sliding window: the TTT attention's work linear in T, its memory unchanged)
tokens/s: the harness's timed steps; a cli row's steady rate from its RUN/logs/step_times.csv after --warmup
steps (both rounded up to multiples of the recipe's train.log_every_steps, the steps it times). % of harness:
against the harness row of the same T in this call (--harness-row none: the cli rows alone). % of 790 TFLOP/s by
shapes: the row's tokens/s times its FLOPs a token (the target's forward and the method's MethodSpec.train_flops
under the row's overrides, as the harness counts), against an H200's bf16 matmul ceiling. GiB beyond the weights:
the harness's peak beyond what was resident before its row (the target's weights); a cli row's peak allocated
(train_summary.json) less the target's weights. A row that runs out of memory says OOM. With --profile N, the
harness profiles N more steps and each length gets a `cli-profile` row (tools/profile_train.py, N steps after
--warmup): device busy ms, kernel launches and host waits per step, side by side. OUT/cli.json; each process's log in OUT/logs.

Memory at long T, the arithmetic these rows test (Llama-3.1-8B shapes: H = 4096, I = 14336, 32 query and 8 KV
heads of D = 128, draft vocabulary Vd = 32000, K = 7 TTT steps; bf16, one sequence of T tokens a step):
  - fixed: the target's weights (16.1 GB, left out of "beyond the weights"), the draft's 0.43 G parameters with
    their float32 weights, gradients and 8-bit AdamW moments (about 4.3 GB), the bf16 weight copies autocast keeps.
  - once per token: the teacher's logits over the draft vocabulary 2 Vd = 64 kB (written in place, no second
    copy), the target's captured states (three feature layers, the embeddings, the final state) 5 x 2H = 41 kB.
  - per token and TTT step, what the backward keeps under swiglu checkpointing: the layer's [embedding ; hidden]
    input 2 x 2H = 16 kB, q, k and v 2 (32 + 2 x 8) D = 12 kB, the attention's output 8 kB, the step's hidden state,
    residual and normed states 3 x 2H = 25 kB, gate and up 2 x 2I = 57 kB: about 120 kB, plus what the compiled
    norms and merge keep (tools/bench/train.py `activations` counts it; selective drops gate and up and the
    normed MLP input, full keeps the step's inputs alone). Flex attention keeps O(T) (its output and log-sum-exp),
    with or without a window: a window changes the attention's work (T x window instead of T^2 / 2), not its
    memory. The BlockMask is O((T / 128)^2) int32 (a few MB at T = 65,536), built a band of rows at a time past
    T = 16,384 (create_block_mask's whole [T, T] mask would be 4.3 GB there).
  - per token and TTT step, the LM head's logits 2 Vd = 64 kB while the loss keeps them: past
    method.loss_chunk_rows (32,768 rows) the head and loss run in chunks recomputed in the backward, so at
    T = 65,536 they keep nothing (7 x 4.2 GB = 29 GB otherwise; one 4.2 GB chunk and its gradient are transient).
At T = 65,536: 7 x T x (120 kB and the compiled parts' share) = 55 GB and more, the teacher and features 7 GB,
the draft's state 4.3 GB: 70-100 GB beyond the weights, inside an H200's 141 GB beside the target's 16 GB (the
logits kept, 29 GB more, would not fit). Where it does not, `--variant selective:train.activation_checkpointing=
selective` recomputes the MLP (and the head) in the backward instead of keeping gate and up (26 GB less at 64K).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from tools.bench import scale_runs
from tools.bench.suite import REPO, finish, fmt, machine, markdown_table, write_report
from tools.bench.train import REFERENCE_PEAK_TFLOPS

HARNESS_CONFIGS = {"llama8b": "llama3-8b", "smollm2": "smollm2", "tiny": "tiny"}
"""The scaling suite's target shapes -> tools/bench/train.py's configuration of the same target."""
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="specdraft train with a recipe's settings beside the harness row")
    parser.add_argument("--config", choices=sorted(HARNESS_CONFIGS), default="llama8b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "eagle3_llama3.yaml")
    parser.add_argument("--seq-lens", "--lengths", dest="seq_lens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--window", type=int, default=0, metavar="W",
                        help="one more row a length with method.attention_window=W (LongSpec's sliding window)")
    parser.add_argument("--sinks", type=int, default=4, help="its method.attention_sinks")
    parser.add_argument("--harness-row", default="ours-swiglu-8bit-fused",
                        help="tools/bench/train.py's row beside the cli rows, or none (the cli rows alone)")
    parser.add_argument("--harness-warmup", type=int, default=2)
    parser.add_argument("--harness-steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=20, help="cli steps not timed (compiles, DeepSpeed's start)")
    parser.add_argument("--steps", type=int, default=30, help="cli steps timed")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="one more cli row with these overrides (repeatable)")
    parser.add_argument("--log-every", type=int, default=None, metavar="N",
                        help="the cli rows' train.log_every_steps (default: the recipe's): the unit --warmup and "
                             "--steps round up to, smaller for a short run")
    parser.add_argument("--rows", type=int, default=64, help="synthetic rows a length (cycled)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per process")
    parser.add_argument("--out", type=Path, required=True, help="OUT/cli.json, OUT/harness.json, OUT/logs")
    parser.add_argument("--work", type=Path, help="the target, rows and runs (checkpoints: GBs; default OUT/work)")
    args = parser.parse_args(argv)
    args.work = args.work or args.out / "work"
    return args


def variants(texts: List[str], window: int = 0, sinks: int = 4) -> List[Tuple[str, List[str]]]:
    """--variant texts (and --window) -> [(row name, overrides)], the recipe as it is first."""
    rows = [("cli", [])]
    if window:
        rows.append(("cli-window", [f"method.attention_window={window}", f"method.attention_sinks={sinks}"]))
    for text in texts:
        name, _, overrides = text.partition(":")
        rows.append((f"cli-{name}", [item for item in overrides.split(",") if item]))
    return rows


def timed_steps(recipe, warmup: int, steps: int) -> Tuple[int, int]:
    """(warmup, steps) rounded up to multiples of the recipe's train.log_every_steps (the steps it times)."""
    every = max(1, recipe.train.log_every_steps)
    return every * math.ceil(max(warmup, every) / every), every * math.ceil(max(steps, 2 * every) / every)


def target_weight_bytes(shape: dict, cuda: bool) -> int:
    """The random target's weights as `specdraft train` holds them (bf16 on a GPU, float32 on a CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False))
    return sum(p.numel() for p in model.parameters()) * (2 if cuda else 4)


def run_logged(args, argv: List[str], log_name: str) -> Tuple[int, str]:
    """One process, its output in OUT/logs/LOG_NAME.log -> (exit code, or -1 after --timeout; its last lines)."""
    log_path = args.out / "logs" / f"{log_name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        try:
            code = scale_runs.run_process_group(argv, scale_runs.train_env(args.device), log, args.timeout)
        except subprocess.TimeoutExpired:
            code = -1
    return code, scale_runs.log_tail(log_path, 12)


def failure(code: int, tail: str, timeout: int) -> str:
    if code == -1:
        return f"timeout after {timeout} s"
    return "OOM" if any(marker in tail for marker in OOM_MARKERS) else f"error: exit {code}: {tail[-300:]}"


def run_harness(args) -> dict:
    """tools/bench/train.py's row at every length -> its report (rows keyed by length), or {"status": error}."""
    if args.harness_row == "none":
        return {"status": "not run (--harness-row none)", "rows": {}}
    out = args.out / "harness.json"
    argv = [sys.executable, "-m", "tools.bench.train", "--config", HARNESS_CONFIGS[args.config],
            "--device", args.device, "--rows", args.harness_row, "--seq-lens", *map(str, args.seq_lens),
            "--warmup", str(args.harness_warmup), "--steps", str(args.harness_steps), "--out", str(out)]
    argv += ["--profile", str(args.profile)] if args.profile else []
    code, tail = run_logged(args, argv, "harness")
    if code != 0:
        return {"status": failure(code, tail, args.timeout), "rows": {}}
    report = json.loads(out.read_text())
    return {"status": "ok", "target_weights_gib": report["target_weights_gib"],
            "rows": {row["seq_len"]: row for row in report["rows"]}}


def cli_argv(args, recipe, seq_len: int, name: str, overrides: List[str], profile: bool) -> Tuple[list, Path]:
    """The `specdraft train` (or tools/profile_train.py) command of one cli row -> (argv, its train directory)."""
    work = args.work
    run = work / "runs" / f"{name}-{seq_len}"
    warmup, steps = timed_steps(recipe, args.warmup, args.steps)
    where = [f"target.path={work / 'target'}", "target.random_init=true",
             f"distill.output_dir={work / f'data-{seq_len}'}", "train.devices=1"]
    where += [] if seq_len == recipe.data.max_length else [f"data.max_length={seq_len}"]
    where += [] if args.log_every is None else [f"train.log_every_steps={args.log_every}"]
    if profile:
        return [sys.executable, "-m", "tools.profile_train", str(args.recipe), *where, *overrides,
                "--warmup", str(warmup), "--steps", str(args.profile), "--out", str(run)], run / "train"
    where += [f"train.output_dir={run}", f"train.max_steps={warmup + steps}"]
    return [sys.executable, "-m", "specdraft.cli", "train", str(args.recipe), *where, *overrides], run


def measure_cli(args, recipe, seq_len: int, name: str, overrides: List[str]) -> dict:
    from specdraft.train.timing import read_step_times, steady_rate

    result = {"row": name, "seq_len": seq_len, "overrides": overrides, "status": "ok"}
    argv, run = cli_argv(args, recipe, seq_len, name, overrides, profile=False)
    code, tail = run_logged(args, argv, f"{name}-{seq_len}")
    if code != 0:
        return {**result, "status": failure(code, tail, args.timeout)}
    warmup, _ = timed_steps(recipe, args.warmup, args.steps)
    rows = read_step_times(run / "logs" / "step_times.csv")
    summary = json.loads((run / "train_summary.json").read_text())
    result.update(tokens_per_s=steady_rate(rows, warmup // max(1, recipe.train.log_every_steps)),
                  peak_bytes=summary.get("peak_gpu_memory_bytes"), steps=summary["steps"])
    return result


def profile_cli(args, recipe, seq_len: int) -> dict:
    argv, run = cli_argv(args, recipe, seq_len, "cli-profile", [], profile=True)
    code, tail = run_logged(args, argv, f"cli-profile-{seq_len}")
    if code != 0:
        return {"row": "cli-profile", "seq_len": seq_len, "status": failure(code, tail, args.timeout)}
    report = json.loads((run.parent / "profile_train.json").read_text())
    return {"row": "cli-profile", "seq_len": seq_len, "status": "ok", "ops": report}


def shapes_flop_per_token(args, seq_len: int, overrides: List[str]) -> float:
    """Training FLOPs per token by the tensors' shapes: the target's forward and the recipe's method's own count
    (MethodSpec.train_flops) under the row's overrides (a window cuts the attention's share), as the harness counts."""
    from transformers import LlamaConfig

    from specdraft.core.types import TargetInfo
    from specdraft.methods import get_method
    from specdraft.recipes import load_recipe
    from tools.bench.train_rows import target_flops_per_token

    recipe = load_recipe(args.recipe, overrides)
    info = TargetInfo.from_hf_config(LlamaConfig(**scale_runs.CONFIGS[args.config]["target"]), "random weights")
    draft = get_method(recipe.method_name).train_flops(recipe.method, info, seq_len)
    return sum(target_flops_per_token(info, seq_len).values()) + sum(draft.values())


def compare(result: dict, harness: dict, weights_bytes: int, flop_per_token: float) -> dict:
    """A cli row with its share of the harness row at its length, of the 790 TFLOP/s reference by the shapes'
    FLOPs, and its memory beyond the target's weights."""
    base = harness["rows"].get(result["seq_len"], {})
    ok = result["status"] == "ok" and result.get("tokens_per_s") and base.get("status") == "ok"
    result["share_of_harness"] = result["tokens_per_s"] / base["tokens_per_s"] if ok else None
    result["flop_per_token_shapes"] = flop_per_token
    rate = result.get("tokens_per_s") if result["status"] == "ok" else None
    result["mfu_shapes_vs_790"] = rate * flop_per_token / 1e12 / REFERENCE_PEAK_TFLOPS if rate else None
    peak = result.get("peak_bytes")
    result["gib_beyond_weights"] = None if peak is None else (peak - weights_bytes) / 2 ** 30
    return result


def profile_cells(ops: Optional[dict]) -> List[str]:
    if not ops:
        return ["", "", ""]
    waits = sum(ops.get("host_waits_per_step", {}).values())
    return [f"{ops['device_busy_ms']:.1f}", f"{ops['kernel_launches_per_step']:.0f}", f"{waits:g}"]


def table(report: dict) -> str:
    rows = []
    for seq_len in report["seq_lens"]:
        base = report["harness"]["rows"].get(seq_len, {"status": report["harness"]["status"]})
        mfu = base.get("mfu_shapes_vs_790")
        rows.append([f"harness ({report['harness_row']})", seq_len, base["status"],
                     fmt(base.get("tokens_per_s"), ",.0f"), "100%" if base.get("status") == "ok" else "",
                     "" if mfu is None else f"{100 * mfu:.1f}%",
                     fmt(base.get("peak_gib_beyond_resident"), ".2f"), *profile_cells(base.get("ops"))])
        for r in (r for r in report["results"] if r["seq_len"] == seq_len):
            share = fmt(None if r.get("share_of_harness") is None else 100 * r["share_of_harness"], ".1f")
            mfu = fmt(None if r.get("mfu_shapes_vs_790") is None else 100 * r["mfu_shapes_vs_790"], ".1f")
            rows.append([r["row"], seq_len, r["status"][:80], fmt(r.get("tokens_per_s"), ",.0f"),
                         share + ("%" if share != "-" else ""), mfu + ("%" if mfu != "-" else ""),
                         fmt(r.get("gib_beyond_weights"), ".2f"),
                         *profile_cells((r.get("ops") or {}) if r["row"] == "cli-profile" else None)])
    return markdown_table(["row", "T", "status", "tokens/s", "% of harness", "% of 790 TFLOP/s by shapes",
                           "GiB beyond the weights",
                           "device busy ms", "launches", "host waits"], rows)


def main(argv=None) -> dict:
    from specdraft.recipes import load_recipe

    args = parse_args(argv)
    spec = scale_runs.CONFIGS[args.config]
    work = args.work
    scale_runs.write_target(work / "target", spec["target"])
    for seq_len in args.seq_lens:
        scale_runs.write_rows(work / f"data-{seq_len}", args.rows, seq_len, spec["target"]["vocab_size"])
    recipe = load_recipe(args.recipe, [] if args.log_every is None else [f"train.log_every_steps={args.log_every}"])
    weights = target_weight_bytes(spec["target"], args.device == "cuda")
    report = {"machine": machine(args.device), "recipe": str(args.recipe), "harness_row": args.harness_row,
              "seq_lens": args.seq_lens, "target": spec["target"], "target_weights_gib": weights / 2 ** 30,
              "harness": run_harness(args), "results": []}
    print(f"harness: {report['harness']['status']}", flush=True)
    for seq_len in args.seq_lens:
        for name, overrides in variants(args.variant, args.window, args.sinks):
            flops = shapes_flop_per_token(args, seq_len, overrides)
            report["results"].append(compare(measure_cli(args, recipe, seq_len, name, overrides),
                                             report["harness"], weights, flops))
            print(f"{name} T={seq_len}: {report['results'][-1]['status'][:200]}", flush=True)
            write_report(args.out, report, "cli")
        if args.profile:
            report["results"].append(profile_cli(args, recipe, seq_len))
    return finish(table(report), args.out, report, "cli")


if __name__ == "__main__":
    main()
