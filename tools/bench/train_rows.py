"""The training suite's rows and what runs them (tools/bench/train.py's `step`; tools/bench/step_graphs.py builds on
the same target): the target configurations (CONFIGS), the rows (Row, ROWS: the list train.py's docstring gives),
the random-weight target and the settings every row shares (Bench), a row's fresh draft, optimizer and step
(Trainee), the timer its phases go to (PhaseTimer), the memory freed between rows (free_memory), and the model FLOPs
per token the MFU columns divide by (issue 6's count and one from the shapes).
"""
from __future__ import annotations

import functools
import gc
import os
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures, TargetInfo
from specdraft.layers.compile import compile_decoder_layers, compile_enabled
from specdraft.methods import get_method
from specdraft.train.features import OnlineFeatures
from specdraft.train.module import build_optimizer

TTT_STEPS = 7
ISSUE_FLOP_PER_TOKEN = {"eagle3": (15.6e9, 17.4e9)}
"""Issue 6's count of a method's training, (target, draft) GFLOP a token at 8B shapes: the "issue" figure of its
rows (another method's is its shapes' count)."""
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
CONFIGS = {
    "llama3-8b": {"model": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, max_position_embeddings=131072),
                  "eagle3": dict(ttt_steps=TTT_STEPS, draft_vocab_size=32000),
                  "seq_lens": [2048, 8192], "ceiling_size": 8192,
                  "dflash": dict(block_size=16, num_layers=5, num_anchors=512),
                  "peagle": dict(num_depths=TTT_STEPS, draft_vocab_size=32000)},
    "smollm2": {"model": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                              num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0,
                              max_position_embeddings=8192),
                "eagle3": dict(ttt_steps=TTT_STEPS, draft_vocab_size=8192),
                "seq_lens": [1024], "ceiling_size": 8192,
                "dflash": dict(block_size=16, num_layers=3, num_anchors=256),
                "peagle": dict(num_depths=TTT_STEPS, draft_vocab_size=8192)},
    "tiny": {"model": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, rope_theta=10000.0, max_position_embeddings=4096),
             "eagle3": dict(ttt_steps=TTT_STEPS, draft_vocab_size=256),
             "seq_lens": [32, 64], "ceiling_size": 256,
             "dflash": dict(block_size=4, num_layers=2, num_anchors=8),
             "peagle": dict(num_depths=4, draft_vocab_size=256)},
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
    method: str = "eagle3"
    """The registered method whose draft the row trains: eagle3 (TTT_STEPS steps, the config's draft vocabulary) or
    another, with the config's settings under the method's name (CONFIGS); its FLOPs are its MethodSpec.train_flops."""


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
    Row("dflash", "online", "auto", "swiglu", compile=True, optimizer="adamw8bit_fused", method="dflash"),
    Row("dflash-selective", "online", "auto", "selective", compile=True, optimizer="adamw8bit_fused",
        method="dflash"),
    Row("peagle", "online", "auto", "swiglu", compile=True, optimizer="adamw8bit_fused", method="peagle"),
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


def target_flops_per_token(info: TargetInfo, seq_len: int) -> Dict[str, float]:
    """Forward FLOPs per token of the target's decoder: its layers' matmuls and causal attention (what a draft's
    training reads of its LM head is in the method's own count, MethodSpec.train_flops)."""
    hidden, q_width, kv_width = info.hidden_size, info.num_heads * info.head_dim, info.num_kv_heads * info.head_dim
    matmuls = 2 * hidden * (2 * q_width + 2 * kv_width) + 6 * hidden * info.intermediate_size
    attention = 4 * q_width * (seq_len + 1) / 2  # QK^T and PV over the average causal context
    return {"layers": info.num_layers * matmuls, "attention": info.num_layers * attention}

@dataclass
class FullLogitsFeatures(TargetFeatures):
    """The first implementation's features: the Hugging Face forward's full [B, T, V] logits."""

    logits: Optional[torch.Tensor] = None

    def logits_for(self, vocab_ids: torch.Tensor) -> torch.Tensor:
        return self.logits[..., vocab_ids]

    def logits_into(self, vocab_ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(self.logits[..., vocab_ids].flatten(0, 1))

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
        self.config, self.draft_vocab = config, config["eagle3"]["draft_vocab_size"]
        self.target = build_target(config["model"], device, self.dtype)
        self.info = TargetInfo.from_hf_config(self.target.config, "random weights")
        self.spec = get_method("eagle3")
        self.layers = self.spec.feature_layers(self.spec.config(), self.info)

    def method_config(self, row: Row):
        """-> (the row's method spec, its config): the config's settings under the method's name (CONFIGS)."""
        spec = get_method(row.method)
        attention = "dense" if row.kernels == "reference" else self.attention
        return spec, spec.config(**self.config[row.method], attention=attention)

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.cuda else nullcontext()

    def flops_per_token(self, row: Row, seq_len: int) -> Dict[str, float]:
        """FLOPs per token: "shapes" (by the tensors' shapes: the target's layers, none for offline features, and
        the method's MethodSpec.train_flops), "issue" (issue 6's count where ISSUE_FLOP_PER_TOKEN has the method,
        else the shapes' count) and their parts."""
        spec, cfg = self.method_config(row)
        if spec.train_flops is None:
            raise SpecdraftError(f"method {row.method!r} declares no train_flops: its rows cannot be counted")
        target = {} if row.features == "offline" else target_flops_per_token(self.info, seq_len)
        draft = spec.train_flops(cfg, self.info, seq_len)
        shapes = sum(target.values()) + sum(draft.values())
        issue = ISSUE_FLOP_PER_TOKEN.get(row.method)
        issue = shapes if issue is None else issue[1] + (0 if row.features == "offline" else issue[0])
        return {"issue": issue, "shapes": shapes, **{f"target_{k}": v for k, v in target.items()},
                **{f"draft_{k}": v for k, v in draft.items()}}

    def inputs(self, row: Row, seq_len: int) -> dict:
        input_ids = torch.randint(0, self.info.vocab_size, (1, seq_len), device=self.device)
        position_ids, document_ids = packed_positions(seq_len, row.documents, self.device)
        ones = torch.ones_like(input_ids)
        return {"input_ids": input_ids, "loss_mask": ones, "attention_mask": ones, "position_ids": position_ids,
                "document_ids": document_ids}

    def feature_source(self, row: Row, batch: dict, layers: List[int]) -> Callable[[], TargetFeatures]:
        """What the step calls to get the target's features (its `layers`) for `batch`."""
        if row.features == "full-logits":
            return lambda: full_logits_features(self.target, batch["input_ids"], batch["attention_mask"], layers)
        if row.features == "online":
            return functools.partial(OnlineFeatures(self.target, layers), batch)  # as `train` runs it
        shape = (*batch["input_ids"].shape, self.info.hidden_size)
        hidden = {i: torch.randn(shape, device=self.device, dtype=self.dtype) for i in sorted({0, *layers})}
        final = torch.randn(shape, device=self.device, dtype=self.dtype)
        lm_head, embed = self.target.get_output_embeddings().weight, self.target.get_input_embeddings().weight
        return lambda: TargetFeatures(hidden_states=hidden, final_hidden=final, lm_head=lm_head, embed_tokens=embed)


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


def free_memory(cuda: bool) -> None:
    """What a row left behind freed before the next one (its draft, optimizer and the cached CUDA blocks)."""
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


class Trainee:
    """A fresh draft, its optimizer and one row's step function."""

    def __init__(self, bench: Bench, row: Row, seq_len: int):
        self.bench, self.row = bench, row
        self.spec, self.cfg = bench.method_config(row)
        counts = torch.randint(0, 1000, (bench.info.vocab_size,))
        context = DraftContext(bench.info, counts, activation_checkpointing=row.checkpointing,
                               compile=row_compiles(row, bench.cuda))
        with torch.device(bench.device):
            self.draft = self.spec.build(self.cfg, context)
        if row.optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(self.draft.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                               fused=bench.cuda)
        else:
            self.optimizer = build_optimizer(row.optimizer, self.draft.parameters(), lr=1e-4, weight_decay=0.0)
        self.batch = bench.inputs(row, seq_len)
        self.features = bench.feature_source(row, self.batch, self.spec.feature_layers(self.cfg, bench.info))

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
                    loss = self.spec.loss(self.draft, draft_batch, self.cfg).loss
            with timer.phase("backward"):
                loss.backward()
            with timer.phase("optimizer"):
                torch.nn.utils.clip_grad_norm_(self.draft.parameters(), 0.5)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
