"""Training suite: throughput, model FLOPs utilization and memory of one EAGLE-3 training step at real scale
(`step`, the default), and what each activation checkpointing mode keeps for the backward (`activations`).

    python -m tools.bench.train --out runs/bench                                     # one GPU, about 3 minutes
    python -m tools.bench.train --rows baseline ours-swiglu ours-swiglu-8bit-fused   # the rows docs/benchmarks.md has
    python -m tools.bench.train --config tiny --device cpu --out /tmp/bench           # the same rows, tiny, CPU
    python -m tools.bench.train --seq-lens 2048 --rows ours-no-ckpt --profile 2      # and where its step goes
    python -m tools.bench.train --rows dflash dflash-selective --out runs/bench       # DFlash's step, one GPU
    python -m tools.bench.train activations --seq-len 256 --out runs/bench            # CPU, about 2 minutes

`step`: one step is the frozen target's forward (no grad, bf16), the draft's 7 TTT steps forward and backward
(a DFlash row: all its blocks in one forward and backward), AdamW. The target is built from Llama-3.1-8B's configuration with random weights (speed and memory do not depend
on their values); the draft comes from the method registry. Each row runs a few warm-up steps, then timed ones.

Rows (--rows, in this order at each sequence length):
  ours              flex attention with block masks, the Triton soft cross-entropy, hook-captured target features,
                    draft activation checkpointing
  ours-no-ckpt      ours without activation checkpointing (what checkpointing costs in time and saves in memory)
  ours-packed       ours on a row of 4 packed conversations (per-document masks in the target and the draft)
  offline           ours fed precomputed hidden states, as `train` reading dumped features does: no target layers
                    run (the target's LM head stays, for the teacher)
  baseline          the straightforward implementation: the target's full-vocabulary logits from its Hugging Face
                    forward, dense TTT masks, the reference soft cross-entropy (float32 [B, T, Vd] softmaxes), no
                    checkpointing
  ours-selective    ours with selective checkpointing (attention kept; MLP block, LM head and loss recomputed)
                    and train.compile (the target's decoder layers, the draft layer around its attention)
  ours-swiglu       ours-selective with swiglu checkpointing instead (only silu and the product recomputed)
  ours-8bit         ours-selective with bitsandbytes' AdamW8bit (2 bytes of optimizer state per parameter)
  ours-swiglu-8bit  ours-swiglu with AdamW8bit
  ours-swiglu-8bit-fused  ours-swiglu with specdraft's AdamW8bitFused (the same 8-bit state, one fused Triton kernel
                    per tensor: train.optimizer=adamw8bit_fused)
  offline-swiglu-8bit-fused  ours-swiglu-8bit-fused fed precomputed hidden states (data.features=offline)
  dflash            a DFlash draft (its settings: the config's; Llama-3.1-8B: block 16, 5 layers, 512 anchors a
                    sequence, the target's LM head shared) on the ours-swiglu-8bit-fused path: flex block mask,
                    compiled, the Triton soft cross-entropy over the full vocabulary, AdamW8bitFused
  dflash-selective  dflash with selective checkpointing (each layer recomputed, the LM head and loss in chunks of
                    4096 rows recomputed: no [rows, V] logits kept)
Compiling rows compile on CUDA only (train.compile=auto): on a CPU they run eagerly, and the report's
`compiled` says which ran compiled.
A row that runs out of memory is reported as OOM; any other failure is reported and the next row runs.

Timed steps run back to back, as a trainer runs them (no sync between them); a step's time is the wall clock of
the timed steps over their number (`step_ms`), and each phase's time comes from CUDA events read after the last
one (`phases_ms`; `device_step_ms` is a step's span on the GPU's timeline).

Model FLOPs are counted two ways: issue 6's count (15.6 GFLOP/token target forward + 17.4 GFLOP/token draft, 7
steps forward and backward) and one from the shapes (printed with its parts). MFU is reported against the card's
measured bf16 matmul ceiling (an 8192^3 matmul) and against 790 TFLOP/s. Peak memory is the most allocated
during the timed steps beyond what was resident before the row (the target's weights). Writes OUT/train.json
(or --out itself, a .json path). The rows, the target and the step they run are tools/bench/train_rows.py's; this
module times them and tables what it measured.

`activations`: the draft at real widths (Llama-3.1-8B: hidden 4096, MLP 14336, 32000-token draft vocabulary,
float32 weights) runs its 7 TTT steps and loss under bf16 autocast on random target features; saved_tensors_hooks
record every tensor autograd keeps, counted once per storage. Parameters are left out; the rest is split into

  layer        the draft's fc and decoder layer activations (what the checkpointing modes act on)
  head_loss    tensors with the draft vocabulary as last dimension (LM head and soft cross-entropy). On a CPU
               the loss is the reference soft cross-entropy; the Triton kernel on a GPU keeps 2 B x Vd per token
               and step instead (checkpointed by selective and full: nothing).
  weight_casts bf16 copies of the float32 weights (q/k/v and gate/up joined), kept for the weights' own
               gradients (once per forward, compiled or not; full checkpointing casts them again in the backward)
  dense_attn   the dense TTT attention's [.., T, keys] scores, probabilities and masks: the CPU's attention;
               flex attention on a GPU keeps none of them (its q, k, v, output and log-sum-exp are in `layer`)

It measures what is kept at the end of the forward, not the backward's transient peak (full checkpointing
recomputes one step at a time there). `--compile` runs the draft layer's parts under torch.compile. Writes
OUT/activations.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, List, Optional

from tools.bench import train_rows
from tools.bench.suite import finish, fmt, machine, markdown_table, run_parts

import torch

from specdraft.config import CHECKPOINTING
from specdraft.methods import get_method
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures, TargetInfo
from specdraft.train.profiling import op_report, print_op_tables

REFERENCE_PEAK_TFLOPS = 790.0  # a large bf16 matmul on an H200 (issue 6)


def matmul_ceiling_tflops(device: str, size: int, dtype: torch.dtype, iters: int = 10) -> float:
    """Achieved TFLOP/s of a size^3 matmul (the card's practical ceiling)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    timer = train_rows.PhaseTimer(device == "cuda")
    with timer.phase("matmul"):
        for _ in range(iters):
            a @ b
    return 2 * size ** 3 * iters / (timer.read_ms()["matmul"] / 1e3) / 1e12


def phase_breakdown(spans_ms: Dict[str, float]) -> Dict[str, float]:
    """Raw spans -> target, teacher, draft_forward, loss, backward, optimizer, other (ms, one step)."""
    forward = spans_ms.get("forward", 0.0)
    teacher, loss = spans_ms.get("teacher", 0.0), spans_ms.get("loss", 0.0)
    phases = {"target": spans_ms.get("target", 0.0), "teacher": teacher,
              "draft_forward": forward - teacher - loss, "loss": loss,
              "backward": spans_ms.get("backward", 0.0), "optimizer": spans_ms.get("optimizer", 0.0)}
    phases["other"] = spans_ms.get("step", 0.0) - sum(phases.values())
    return phases


def _timed_steps(trainee: train_rows.Trainee, cuda: bool, warmup: int, steps: int):
    """-> (mean phase ms per step, peak bytes allocated during the timed steps or None on CPU)."""
    timer = train_rows.PhaseTimer(cuda)
    loss_module = sys.modules[trainee.spec.loss.__module__]  # the module whose soft_cross_entropy the loss calls
    soft_ce = loss_module.soft_cross_entropy
    loss_module.soft_cross_entropy = timer.wrap("loss", soft_ce)
    try:
        for _ in range(warmup):
            trainee.step(timer)
        timer.read_ms()  # the warm-up's spans dropped (synchronizes)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(steps):  # back to back, as a trainer runs them: no sync between steps
            trainee.step(timer)
        totals = {name: value / steps for name, value in timer.read_ms().items()}  # one sync, after the last
        totals["wall"] = (time.perf_counter() - start) * 1e3 / steps
    finally:
        loss_module.soft_cross_entropy = soft_ce
    return totals, (torch.cuda.max_memory_allocated() if cuda else None)


def _profiled_ops(trainee: train_rows.Trainee, cuda: bool, steps: int, top: int = 15) -> dict:
    """Op tables (specdraft.train.profiling) of `steps` more steps under torch.profiler, after the timed ones."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            trainee.step(train_rows.PhaseTimer(cuda))
        if cuda:
            torch.cuda.synchronize()
    return op_report(profiler, steps, top)


def run_row(bench: train_rows.Bench, row: train_rows.Row, seq_len: int, warmup: int, steps: int,
            profile_steps: int = 0) -> dict:
    """One row at one sequence length -> its result (status ok, OOM or error: ...); with profile_steps, its op
    tables from that many more steps under torch.profiler ("ops")."""
    train_rows.free_memory(bench.cuda)
    resident = torch.cuda.memory_allocated() if bench.cuda else 0
    result = {"row": row.name, "method": row.method, "seq_len": seq_len, "tokens_per_step": seq_len,
              "status": "ok", "checkpointing": row.checkpointing, "optimizer": row.optimizer,
              "compiled": train_rows.row_compiles(row, bench.cuda)}
    try:
        compiled_target = train_rows.compiled_target(bench.target, result["compiled"] and row.features == "online")
        with train_rows.kernels_env(row.kernels), compiled_target:
            trainee = train_rows.Trainee(bench, row, seq_len)
            spans, peak = _timed_steps(trainee, bench.cuda, warmup, steps)
            if profile_steps:
                result["ops"] = _profiled_ops(trainee, bench.cuda, profile_steps)
    except torch.cuda.OutOfMemoryError:
        result["status"] = "OOM"
    except Exception as err:  # a failing row is reported, the others still run
        result["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
    trainee = None
    train_rows.free_memory(bench.cuda)
    if result["status"] != "ok":
        return result
    step_ms = spans["wall"]
    result.update(step_ms=step_ms, tokens_per_s=seq_len / (step_ms / 1e3), phases_ms=phase_breakdown(spans),
                  device_step_ms=spans["step"],
                  flop_per_token=bench.flops_per_token(row, seq_len),
                  peak_gib_beyond_resident=None if peak is None else (peak - resident) / 2 ** 30)
    return result


def add_mfu(result: dict, ceiling_tflops: float) -> None:
    if result["status"] != "ok":
        return
    for count in ("issue", "shapes"):
        achieved = result["flop_per_token"][count] * result["tokens_per_s"] / 1e12
        result[f"tflops_{count}"] = achieved
        result[f"mfu_{count}_vs_ceiling"] = achieved / ceiling_tflops
        result[f"mfu_{count}_vs_790"] = achieved / REFERENCE_PEAK_TFLOPS


PHASES = ["target", "teacher", "draft_forward", "loss", "backward", "optimizer", "other"]


def tables(report: dict) -> str:
    """The step table (tokens/s, MFU, memory), then ms per step by phase, as docs/benchmarks.md has them."""
    head = (f"{report['machine']}, torch {report['torch']}, matmul ceiling {report['matmul_ceiling_tflops']:.3g} "
            f"TFLOP/s ({report['ceiling_size']}^3 {report['dtype']})\n\n")
    step = []
    for r in report["rows"]:
        if r["status"] != "ok":
            step.append([r["row"], r["seq_len"], r["status"], "", "", "", "", "", ""])
            continue
        step.append([r["row"], r["seq_len"], "ok", f"{r['tokens_per_s']:,.0f}", f"{r['step_ms']:.1f}",
                     f"{r['mfu_issue_vs_ceiling']:.1%}", f"{r['mfu_issue_vs_790']:.1%}",
                     f"{r['mfu_shapes_vs_ceiling']:.1%}", fmt(r["peak_gib_beyond_resident"], ".2f")])
    text = head + markdown_table(["row", "T", "status", "tokens/s", "step ms", "MFU / ceiling", "MFU / 790",
                                  "MFU by shapes / ceiling", "GiB beyond weights"], step)
    phases = [[r["row"], r["seq_len"], *(f"{r['phases_ms'][p]:.1f}" for p in PHASES)]
              for r in report["rows"] if r["status"] == "ok"]
    text += "\n\nms per step by phase\n\n" + markdown_table(["row", "T", *PHASES], phases)
    counts = report["flop_per_token_2048_online"]
    if counts:
        text += "\n\nGFLOP/token (online, T=2048): " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in counts.items())
    return text


def run(config_name: str, device: str, seq_lens: List[int], rows: List[str], warmup: int, steps: int,
        attention: str = "auto", profile_steps: int = 0) -> dict:
    config = train_rows.CONFIGS[config_name]
    bench_started = time.perf_counter()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ceiling = matmul_ceiling_tflops(device, config["ceiling_size"], dtype)
    bench = train_rows.Bench(config, device, attention)
    results = []
    for seq_len in seq_lens:
        if bench.cuda:
            torch._dynamo.reset()  # each length gets its own static compile of the flex call
        for name in rows:
            result = run_row(bench, train_rows.ROWS[name], seq_len, warmup, steps, profile_steps)
            add_mfu(result, ceiling)
            results.append(result)
            print(f"[{time.perf_counter() - bench_started:6.1f} s] {name} T={seq_len}: {result['status']}",
                  flush=True)
    return {
        "machine": machine(device),
        "torch": torch.__version__, "config": config_name, "dtype": str(dtype).replace("torch.", ""),
        "ttt_steps": train_rows.TTT_STEPS, "draft_vocab": bench.draft_vocab, "attention": attention,
        "matmul_ceiling_tflops": ceiling,
        "ceiling_size": config["ceiling_size"], "reference_peak_tflops": REFERENCE_PEAK_TFLOPS,
        "target_weights_gib": sum(p.numel() * p.element_size() for p in bench.target.parameters()) / 2 ** 30,
        "flop_per_token_2048_online":
            bench.flops_per_token(train_rows.ROWS["ours"], 2048) if config_name != "tiny" else {},
        "seconds": time.perf_counter() - bench_started, "rows": results,
    }


def step_main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(
        description="one draft training step (EAGLE-3, DFlash) at real scale: tokens/s, MFU, memory")
    parser.add_argument("--config", choices=sorted(train_rows.CONFIGS), default="llama3-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-lens", type=int, nargs="+", help="default: the config's (2048 8192 for the 8B)")
    parser.add_argument("--rows", nargs="+", choices=list(train_rows.ROWS), default=list(train_rows.ROWS))
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per row (the first compiles)")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per row")
    parser.add_argument("--attention", choices=["auto", "dense", "flex"], default="auto",
                        help="TTT attention of the rows other than baseline (method.attention)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after each row's timed steps, profile this many more: its op tables (most device "
                             "time) go into the JSON (`ops`) and the printout")
    parser.add_argument("--out", default="runs/bench", help="a directory (OUT/train.json) or a .json path")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    if args.device == "cpu":  # tiny tensors: a thread pool only adds overhead (10x on a busy machine)
        torch.set_num_threads(1)
    try:
        report = run(args.config, args.device, args.seq_lens or train_rows.CONFIGS[args.config]["seq_lens"], args.rows,
                     args.warmup, args.steps, args.attention, args.profile)
    finally:
        torch.set_num_threads(threads)
    for r in report["rows"]:
        if "ops" in r:
            print(f"\n{r['row']} T={r['seq_len']}: device busy {r['ops']['device_busy_ms']:.1f} ms per step, "
                  f"{r['ops']['kernel_launches_per_step']:.0f} kernel launches")
            print_op_tables(r["ops"], prefix=f"{r['row']} T={r['seq_len']}, ")
    return finish(tables(report), args.out, report, "train")


ACTIVATION_CONFIGS = {
    "llama3-8b": dict(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=14336, vocab_size=32000, draft_vocab=32000, seq_len=256),
    "tiny": dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=192,
                 vocab_size=512, draft_vocab=256, seq_len=32),
}


def activation_target_info(config: dict) -> TargetInfo:
    """The target's geometry only (its vocabulary cut to the draft's: the teacher keeps nothing for the backward)."""
    shape = {k: v for k, v in config.items() if k not in ("draft_vocab", "seq_len")}
    return TargetInfo(name_or_path="random", model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0,
                      max_position_embeddings=131072, **shape)


def random_batch(info: TargetInfo, layers: List[int], seq_len: int) -> DraftBatch:
    """Random bf16 target features and tokens for one sequence of `seq_len` tokens."""
    shape = (1, seq_len, info.hidden_size)
    features = TargetFeatures(
        hidden_states={i: torch.randn(shape, dtype=torch.bfloat16) for i in sorted({0, *layers})},
        final_hidden=torch.randn(shape, dtype=torch.bfloat16),
        lm_head=torch.randn(info.vocab_size, info.hidden_size, dtype=torch.bfloat16) * 0.02)
    input_ids = torch.randint(0, info.vocab_size, (1, seq_len))
    ones = torch.ones_like(input_ids)
    return DraftBatch(input_ids, ones, ones, features)


def category(tensor: torch.Tensor, param_shapes: set, draft_vocab: int, seq_len: int) -> str:
    """Which part of the draft keeps `tensor` (the docstring's categories), from its shape and dtype."""
    if tuple(tensor.shape) in param_shapes and tensor.dtype == torch.bfloat16:
        return "weight_casts"
    if tensor.shape[-1:] == (draft_vocab,):
        return "head_loss"
    if (tensor.dim() >= 2 and tensor.shape[-2] == seq_len
            and seq_len <= tensor.shape[-1] <= seq_len + train_rows.TTT_STEPS):
        return "dense_attn"
    return "layer"


def joined_weight_shapes(draft) -> set:
    """Shapes of the layers' joined matmul weights (q/k/v, gate/up: specdraft.layers.cast) as they compute."""
    with torch.no_grad():
        layers = [module for module in draft.modules() if hasattr(module, "compute_weights")]
        joined = [weights for layer in layers for weights in (layer.compute_weights(),)]
        return {tuple(weight.shape) for weights in joined for weight in (weights.qkv, weights.gate_up)}


def saved_bytes(draft, batch: DraftBatch, cfg, draft_vocab: int) -> Dict[str, int]:
    """The loss's forward under bf16 autocast -> bytes kept for the backward by category (see the docstring)."""
    params = {p.untyped_storage().data_ptr() for p in draft.parameters()}
    param_shapes = {tuple(p.shape) for p in draft.parameters()} | joined_weight_shapes(draft)
    kept: Dict[int, tuple] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() not in kept:
            part = category(tensor, param_shapes, draft_vocab, batch.input_ids.shape[1])
            kept[storage.data_ptr()] = (part, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            get_method("eagle3").loss(draft, batch, cfg)
    totals = {"layer": 0, "dense_attn": 0, "head_loss": 0, "weight_casts": 0}
    for part, size in kept.values():
        totals[part] += size
    return totals


def run_activations(config_name: str, seq_len: Optional[int], modes: List[str], compile_layers: bool = False) -> dict:
    config = ACTIVATION_CONFIGS[config_name]
    seq_len = seq_len or config["seq_len"]
    info = activation_target_info(config)
    spec = get_method("eagle3")
    cfg = spec.config(ttt_steps=train_rows.TTT_STEPS, draft_vocab_size=config["draft_vocab"], attention="dense")
    torch.manual_seed(0)
    draft = spec.build(cfg, DraftContext(info, torch.randint(0, 1000, (info.vocab_size,))))
    draft.compile_layers = compile_layers
    batch = random_batch(info, spec.feature_layers(cfg, info), seq_len)
    rows = []
    for mode in modes:
        started = time.perf_counter()
        draft.activation_checkpointing = mode
        totals = saved_bytes(draft, batch, cfg, config["draft_vocab"])
        rows.append({"mode": mode, **totals, "layer_per_step": totals["layer"] / train_rows.TTT_STEPS,
                     "seconds": time.perf_counter() - started})
        print(f"{mode}: {totals}", flush=True)
    return {"config": config_name, "seq_len": seq_len, "ttt_steps": train_rows.TTT_STEPS, "compile": compile_layers,
            "draft_vocab": config["draft_vocab"], "hidden_size": info.hidden_size,
            "intermediate_size": info.intermediate_size,
            "draft_parameters": sum(p.numel() for p in draft.parameters()), "rows": rows}


def activations_table(report: dict) -> str:
    mb = 1e6
    rows = [[row["mode"], f"{row['layer'] / mb:.1f}", f"{row['layer_per_step'] / mb:.1f}",
             f"{row['layer_per_step'] / report['seq_len'] * 1000 / mb:.1f}", f"{row['dense_attn'] / mb:.1f}",
             f"{row['head_loss'] / mb:.1f}", f"{row['weight_casts'] / mb:.1f}"] for row in report["rows"]]
    return (f"kept for the backward, T={report['seq_len']}, {report['ttt_steps']} TTT steps, MB (1e6 bytes)\n\n"
            + markdown_table(["mode", "layer", "layer per step", "per 1k tokens and step", "dense_attn",
                              "head_loss", "weight_casts"], rows))


def activations_main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description="bytes an EAGLE-3 forward keeps for its backward, per "
                                                 "train.activation_checkpointing mode (CPU)")
    parser.add_argument("--config", choices=sorted(ACTIVATION_CONFIGS), default="llama3-8b")
    parser.add_argument("--seq-len", type=int, help="default: the config's (256 for the 8B)")
    parser.add_argument("--modes", nargs="+", choices=CHECKPOINTING, default=list(CHECKPOINTING))
    parser.add_argument("--compile", action="store_true", help="the draft layer's parts under torch.compile")
    parser.add_argument("--out", default="runs/bench", help="a directory (OUT/activations.json) or a .json path")
    args = parser.parse_args(argv)
    report = run_activations(args.config, args.seq_len, args.modes, args.compile)
    return finish(activations_table(report), args.out, report, "activations")


def main(argv: Optional[List[str]] = None) -> dict:
    return run_parts({"step": step_main, "activations": activations_main}, argv)


if __name__ == "__main__":
    main()
