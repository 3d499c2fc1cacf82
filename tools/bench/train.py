"""Training suite: throughput, model FLOPs utilization and memory of one EAGLE-3 training step at real scale
(`step`, the default), and what each activation checkpointing mode keeps for the backward (`activations`).

    python tools/bench/train.py --out runs/bench                                     # one GPU, about 3 minutes
    python tools/bench/train.py --rows baseline ours-swiglu ours-swiglu-8bit-fused   # the rows docs/benchmarks.md has
    python tools/bench/train.py --config tiny --device cpu --out /tmp/bench           # the same rows, tiny, CPU
    python tools/bench/train.py --seq-lens 2048 --rows ours-no-ckpt --profile 2      # and where its step goes
    python tools/bench/train.py activations --seq-len 256 --out runs/bench            # CPU, about 2 minutes

`step`: one step is the frozen target's forward (no grad, bf16), the draft's 7 TTT steps forward and backward,
AdamW. The target is built from Llama-3.1-8B's configuration with random weights (speed and memory do not depend
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
(or --out itself, a .json path).

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
import functools
import gc
import os
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from suite import finish, fmt, machine, markdown_table, run_parts

import torch

from specdraft.config import CHECKPOINTING
from specdraft.layers.compile import compile_decoder_layers, compile_enabled
from specdraft.methods.eagle3 import loss as eagle3_loss  # the module whose soft_cross_entropy the loss calls
from specdraft.methods import get_method
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures, TargetInfo
from specdraft.train.features import OnlineFeatures
from specdraft.train.module import build_optimizer
from specdraft.train.profiling import op_report, print_op_tables

TTT_STEPS = 7
REFERENCE_PEAK_TFLOPS = 790.0  # a large bf16 matmul on an H200 (issue 6)
ISSUE_TARGET_FLOP_PER_TOKEN = 15.6e9
ISSUE_DRAFT_FLOP_PER_TOKEN = 17.4e9
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
CONFIGS = {
    "llama3-8b": {"model": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, max_position_embeddings=131072),
                  "draft_vocab": 32000, "seq_lens": [2048, 8192], "ceiling_size": 8192},
    "smollm2": {"model": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                              num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0,
                              max_position_embeddings=8192),
                "draft_vocab": 8192, "seq_lens": [1024], "ceiling_size": 8192},
    "tiny": {"model": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, rope_theta=10000.0, max_position_embeddings=4096),
             "draft_vocab": 256, "seq_lens": [32, 64], "ceiling_size": 256},
}


@dataclass(frozen=True)
class Row:
    name: str
    features: str
    """online (hooks, no full logits), full-logits (the first implementation), offline (precomputed)."""
    kernels: str
    """auto (Triton soft CE and flex attention on CUDA) or reference (SPECDRAFT_KERNELS=reference, dense)."""
    checkpointing: str
    """train.activation_checkpointing: none, swiglu, selective or full."""
    documents: int = 1
    compile: bool = False
    """train.compile=auto (compiled on CUDA) instead of false."""
    optimizer: str = "adamw"
    """adamw (PyTorch's, fused on CUDA), adamw8bit (bitsandbytes) or adamw8bit_fused (kernels/adamw8bit)."""


ROWS = {row.name: row for row in (
    Row("ours", "online", "auto", "full"),
    Row("ours-no-ckpt", "online", "auto", "none"),
    Row("ours-packed", "online", "auto", "full", documents=4),
    Row("offline", "offline", "auto", "full"),
    Row("baseline", "full-logits", "reference", "none"),
    Row("ours-selective", "online", "auto", "selective", compile=True),
    Row("ours-swiglu", "online", "auto", "swiglu", compile=True),
    Row("ours-8bit", "online", "auto", "selective", compile=True, optimizer="adamw8bit"),
    Row("ours-swiglu-8bit", "online", "auto", "swiglu", compile=True, optimizer="adamw8bit"),
    Row("ours-swiglu-8bit-fused", "online", "auto", "swiglu", compile=True, optimizer="adamw8bit_fused"),
    Row("offline-swiglu-8bit-fused", "offline", "auto", "swiglu", compile=True, optimizer="adamw8bit_fused"),
)}


def row_compiles(row: Row, cuda: bool) -> bool:
    """Whether `row` runs compiled on this device (train.compile=auto: on CUDA only)."""
    return compile_enabled("auto" if row.compile else "false", "cuda" if cuda else "cpu")


class PhaseTimer:
    """Time per phase of a step: CUDA events on a GPU (read after the timed steps, with one sync), the wall clock
    on a CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.spans = defaultdict(list)
        self.open: List[str] = []

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextmanager
    def phase(self, name: str):
        start = self._mark()
        self.open.append(name)
        try:
            yield
        finally:
            self.open.pop()
        self.spans[name].append((start, self._mark()))

    def wrap(self, name: str, fn: Callable, within: str = "forward") -> Callable:
        """fn, timed as phase `name` when called within phase `within` (not when checkpointing recomputes it)."""
        def timed(*args, **kwargs):
            if within not in self.open:
                return fn(*args, **kwargs)
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed

    def _elapsed_ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def read_ms(self) -> Dict[str, float]:
        """Total ms per phase since the last read (synchronizes the GPU)."""
        if self.cuda:
            torch.cuda.synchronize()
        totals = {name: sum(self._elapsed_ms(start, end) for start, end in spans) for name, spans in self.spans.items()}
        self.spans.clear()
        return totals


def build_target(model_shape: dict, device: str, dtype: torch.dtype):
    """A Llama with the given shapes and random weights (normal(0, 0.02), norms 1), frozen, in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**model_shape, rms_norm_eps=1e-5, tie_word_embeddings=False)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built directly in bf16: no float32 copy of 8B weights
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02) if parameter.dim() > 1 else parameter.fill_(1.0)
    return model.requires_grad_(False).eval()


def target_flops_per_token(info: TargetInfo, seq_len: int, draft_vocab: int) -> Dict[str, float]:
    """Forward FLOPs per token of the target, by part: decoder matmuls, causal attention, the LM head's draft
    rows (teacher) and its full-vocabulary scan (whether the target's argmax is in the draft vocabulary)."""
    hidden, q_width, kv_width = info.hidden_size, info.num_heads * info.head_dim, info.num_kv_heads * info.head_dim
    matmuls = 2 * hidden * (2 * q_width + 2 * kv_width) + 6 * hidden * info.intermediate_size
    attention = 4 * q_width * (seq_len + 1) / 2  # QK^T and PV over the average causal context
    return {"layers": info.num_layers * matmuls, "attention": info.num_layers * attention,
            "teacher_head": 2 * hidden * draft_vocab, "argmax_scan": 2 * hidden * info.vocab_size}


def draft_flops_per_token(info: TargetInfo, seq_len: int, draft_vocab: int, steps: int) -> Dict[str, float]:
    """Forward + backward (3x forward) FLOPs per token of the EAGLE-3 draft over `steps` TTT steps."""
    hidden, q_width, kv_width = info.hidden_size, info.num_heads * info.head_dim, info.num_kv_heads * info.head_dim
    layer = 2 * (2 * hidden) * (q_width + 2 * kv_width) + 2 * q_width * hidden + 6 * hidden * info.intermediate_size
    attention = sum(4 * q_width * ((seq_len + 1) / 2 + step) for step in range(steps))  # causal + diagonal keys
    return {"fc": 3 * 2 * 3 * hidden * hidden, "layer": 3 * steps * layer, "attention": 3 * attention,
            "lm_head": 3 * steps * 2 * hidden * draft_vocab}


def matmul_ceiling_tflops(device: str, size: int, dtype: torch.dtype, iters: int = 10) -> float:
    """Achieved TFLOP/s of a size^3 matmul (the card's practical ceiling)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    timer = PhaseTimer(device == "cuda")
    with timer.phase("matmul"):
        for _ in range(iters):
            a @ b
    return 2 * size ** 3 * iters / (timer.read_ms()["matmul"] / 1e3) / 1e12


@dataclass
class FullLogitsFeatures(TargetFeatures):
    """The first implementation's features: the Hugging Face forward's full [B, T, V] logits."""

    logits: Optional[torch.Tensor] = None

    def logits_for(self, vocab_ids: torch.Tensor) -> torch.Tensor:
        return self.logits[..., vocab_ids]

    def argmax_in(self, vocab_mask: torch.Tensor, vocab_chunk: int = 0) -> torch.Tensor:
        return vocab_mask[self.logits.argmax(-1)]


@torch.no_grad()
def full_logits_features(model, input_ids, attention_mask, layers) -> FullLogitsFeatures:
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    keep = sorted(set(layers) | {0})
    return FullLogitsFeatures(hidden_states={i: out.hidden_states[i] for i in keep}, final_hidden=None,
                              lm_head=model.get_output_embeddings().weight, logits=out.logits)


def packed_positions(seq_len: int, documents: int, device: str):
    """-> position_ids, document_ids [1, T] for `documents` equal conversations in one row (None for one)."""
    if documents == 1:
        return None, None
    document_ids = torch.arange(seq_len, device=device)[None] * documents // seq_len  # [1, T]
    starts = torch.searchsorted(document_ids[0], torch.arange(documents, device=device))
    return torch.arange(seq_len, device=device)[None] - starts[document_ids], document_ids


class Bench:
    """The target, its geometry and the settings shared by every row."""

    def __init__(self, config: dict, device: str, attention: str = "auto"):
        self.device, self.cuda, self.attention = device, device == "cuda", attention
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.draft_vocab = config["draft_vocab"]
        self.target = build_target(config["model"], device, self.dtype)
        self.info = TargetInfo.from_hf_config(self.target.config, "random weights")
        self.spec = get_method("eagle3")
        self.layers = self.spec.feature_layers(self.spec.config(), self.info)

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.cuda else nullcontext()

    def flops_per_token(self, row: Row, seq_len: int) -> Dict[str, float]:
        target = target_flops_per_token(self.info, seq_len, self.draft_vocab)
        if row.features == "offline":  # no target layers run; the teacher head and the argmax scan still do
            target = {"teacher_head": target["teacher_head"], "argmax_scan": target["argmax_scan"]}
        draft = draft_flops_per_token(self.info, seq_len, self.draft_vocab, TTT_STEPS)
        issue = ISSUE_DRAFT_FLOP_PER_TOKEN + (0 if row.features == "offline" else ISSUE_TARGET_FLOP_PER_TOKEN)
        return {"issue": issue, "shapes": sum(target.values()) + sum(draft.values()),
                **{f"target_{k}": v for k, v in target.items()}, **{f"draft_{k}": v for k, v in draft.items()}}

    def inputs(self, row: Row, seq_len: int) -> dict:
        input_ids = torch.randint(0, self.info.vocab_size, (1, seq_len), device=self.device)
        position_ids, document_ids = packed_positions(seq_len, row.documents, self.device)
        ones = torch.ones_like(input_ids)
        return {"input_ids": input_ids, "loss_mask": ones, "attention_mask": ones, "position_ids": position_ids,
                "document_ids": document_ids}

    def feature_source(self, row: Row, batch: dict) -> Callable[[], TargetFeatures]:
        """What the step calls to get the target's features for `batch`."""
        if row.features == "full-logits":
            return lambda: full_logits_features(self.target, batch["input_ids"], batch["attention_mask"],
                                                self.layers)
        if row.features == "online":
            return functools.partial(OnlineFeatures(self.target, self.layers), batch)  # as `train` runs it
        shape = (*batch["input_ids"].shape, self.info.hidden_size)
        hidden = {i: torch.randn(shape, device=self.device, dtype=self.dtype) for i in sorted({0, *self.layers})}
        final = torch.randn(shape, device=self.device, dtype=self.dtype)
        lm_head = self.target.get_output_embeddings().weight
        return lambda: TargetFeatures(hidden_states=hidden, final_hidden=final, lm_head=lm_head)


@contextmanager
def kernels_env(kernels: str):
    previous = os.environ.get("SPECDRAFT_KERNELS")
    os.environ["SPECDRAFT_KERNELS"] = kernels
    try:
        yield
    finally:
        if previous is None:
            del os.environ["SPECDRAFT_KERNELS"]
        else:
            os.environ["SPECDRAFT_KERNELS"] = previous


@contextmanager
def compiled_target(model, enabled: bool):
    """The target's decoder layers compiled (train.compile) while the row runs, eager again afterwards."""
    if not enabled:
        yield
        return
    compile_decoder_layers(model)
    try:
        yield
    finally:
        for layer in model.get_decoder().layers:
            layer.__dict__.pop("forward", None)  # back to the class's forward


class Trainee:
    """A fresh draft, its optimizer and one row's step function."""

    def __init__(self, bench: Bench, row: Row, seq_len: int):
        self.bench, self.row = bench, row
        self.cfg = bench.spec.config(ttt_steps=TTT_STEPS, draft_vocab_size=bench.draft_vocab,
                                     attention="dense" if row.kernels == "reference" else bench.attention)
        counts = torch.randint(0, 1000, (bench.info.vocab_size,))
        context = DraftContext(bench.info, counts, activation_checkpointing=row.checkpointing,
                               compile=row_compiles(row, bench.cuda))
        with torch.device(bench.device):
            self.draft = bench.spec.build(self.cfg, context)
        if row.optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(self.draft.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                               fused=bench.cuda)
        else:
            self.optimizer = build_optimizer(row.optimizer, self.draft.parameters(), lr=1e-4, weight_decay=0.0)
        self.batch = bench.inputs(row, seq_len)
        self.features = bench.feature_source(row, self.batch)

    def step(self, timer: PhaseTimer) -> None:
        """Target features, loss (draft forward), backward, gradient clip and AdamW; phases into `timer`."""
        batch = self.batch
        with timer.phase("step"):
            with self.bench.autocast():
                with timer.phase("target"):
                    features = self.features()
                for name in ("logits_for", "argmax_in"):
                    setattr(features, name, timer.wrap("teacher", getattr(features, name)))
                draft_batch = DraftBatch(batch["input_ids"], batch["loss_mask"], batch["attention_mask"], features,
                                         position_ids=batch["position_ids"], document_ids=batch["document_ids"])
                with timer.phase("forward"):
                    loss = self.bench.spec.loss(self.draft, draft_batch, self.cfg).loss
            with timer.phase("backward"):
                loss.backward()
            with timer.phase("optimizer"):
                torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 0.5)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)


def phase_breakdown(spans_ms: Dict[str, float]) -> Dict[str, float]:
    """Raw spans -> target, teacher, draft_forward, loss, backward, optimizer, other (ms, one step)."""
    forward = spans_ms.get("forward", 0.0)
    teacher, loss = spans_ms.get("teacher", 0.0), spans_ms.get("loss", 0.0)
    phases = {"target": spans_ms.get("target", 0.0), "teacher": teacher,
              "draft_forward": forward - teacher - loss, "loss": loss,
              "backward": spans_ms.get("backward", 0.0), "optimizer": spans_ms.get("optimizer", 0.0)}
    phases["other"] = spans_ms.get("step", 0.0) - sum(phases.values())
    return phases


def _free_memory(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _timed_steps(trainee: Trainee, cuda: bool, warmup: int, steps: int):
    """-> (mean phase ms per step, peak bytes allocated during the timed steps or None on CPU)."""
    timer = PhaseTimer(cuda)
    soft_ce = eagle3_loss.soft_cross_entropy
    eagle3_loss.soft_cross_entropy = timer.wrap("loss", soft_ce)
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
        eagle3_loss.soft_cross_entropy = soft_ce
    return totals, (torch.cuda.max_memory_allocated() if cuda else None)


def _profiled_ops(trainee: Trainee, cuda: bool, steps: int, top: int = 15) -> dict:
    """Op tables (specdraft.train.profiling) of `steps` more steps under torch.profiler, after the timed ones."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            trainee.step(PhaseTimer(cuda))
        if cuda:
            torch.cuda.synchronize()
    return op_report(profiler, steps, top)


def run_row(bench: Bench, row: Row, seq_len: int, warmup: int, steps: int, profile_steps: int = 0) -> dict:
    """One row at one sequence length -> its result (status ok, OOM or error: ...); with profile_steps, its op
    tables from that many more steps under torch.profiler ("ops")."""
    _free_memory(bench.cuda)
    resident = torch.cuda.memory_allocated() if bench.cuda else 0
    result = {"row": row.name, "seq_len": seq_len, "tokens_per_step": seq_len, "status": "ok",
              "checkpointing": row.checkpointing, "optimizer": row.optimizer, "compiled": row_compiles(row, bench.cuda)}
    try:
        with kernels_env(row.kernels), compiled_target(bench.target, result["compiled"] and row.features == "online"):
            trainee = Trainee(bench, row, seq_len)
            spans, peak = _timed_steps(trainee, bench.cuda, warmup, steps)
            if profile_steps:
                result["ops"] = _profiled_ops(trainee, bench.cuda, profile_steps)
    except torch.cuda.OutOfMemoryError:
        result["status"] = "OOM"
    except Exception as err:  # a failing row is reported, the others still run
        result["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
    trainee = None
    _free_memory(bench.cuda)
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
    config = CONFIGS[config_name]
    bench_started = time.perf_counter()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ceiling = matmul_ceiling_tflops(device, config["ceiling_size"], dtype)
    bench = Bench(config, device, attention)
    results = []
    for seq_len in seq_lens:
        if bench.cuda:
            torch._dynamo.reset()  # each length gets its own static compile of the flex call
        for name in rows:
            result = run_row(bench, ROWS[name], seq_len, warmup, steps, profile_steps)
            add_mfu(result, ceiling)
            results.append(result)
            print(f"[{time.perf_counter() - bench_started:6.1f} s] {name} T={seq_len}: {result['status']}",
                  flush=True)
    return {
        "machine": machine(device),
        "torch": torch.__version__, "config": config_name, "dtype": str(dtype).replace("torch.", ""),
        "ttt_steps": TTT_STEPS, "draft_vocab": bench.draft_vocab, "attention": attention, "matmul_ceiling_tflops": ceiling,
        "ceiling_size": config["ceiling_size"], "reference_peak_tflops": REFERENCE_PEAK_TFLOPS,
        "target_weights_gib": sum(p.numel() * p.element_size() for p in bench.target.parameters()) / 2 ** 30,
        "flop_per_token_2048_online": bench.flops_per_token(ROWS["ours"], 2048) if config_name != "tiny" else {},
        "seconds": time.perf_counter() - bench_started, "rows": results,
    }


def step_main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description="one EAGLE-3 training step at real scale: tokens/s, MFU, memory")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="llama3-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-lens", type=int, nargs="+", help="default: the config's (2048 8192 for the 8B)")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
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
        report = run(args.config, args.device, args.seq_lens or CONFIGS[args.config]["seq_lens"], args.rows,
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
    if tensor.dim() >= 2 and tensor.shape[-2] == seq_len and seq_len <= tensor.shape[-1] <= seq_len + TTT_STEPS:
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
    cfg = spec.config(ttt_steps=TTT_STEPS, draft_vocab_size=config["draft_vocab"], attention="dense")
    torch.manual_seed(0)
    draft = spec.build(cfg, DraftContext(info, torch.randint(0, 1000, (info.vocab_size,))))
    draft.compile_layers = compile_layers
    batch = random_batch(info, spec.feature_layers(cfg, info), seq_len)
    rows = []
    for mode in modes:
        started = time.perf_counter()
        draft.activation_checkpointing = mode
        totals = saved_bytes(draft, batch, cfg, config["draft_vocab"])
        rows.append({"mode": mode, **totals, "layer_per_step": totals["layer"] / TTT_STEPS,
                     "seconds": time.perf_counter() - started})
        print(f"{mode}: {totals}", flush=True)
    return {"config": config_name, "seq_len": seq_len, "ttt_steps": TTT_STEPS, "compile": compile_layers,
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
