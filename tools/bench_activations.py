"""Bytes an EAGLE-3 training forward keeps for its backward, per train.activation_checkpointing mode.

The draft at real widths (Llama-3.1-8B: hidden 4096, MLP 14336, 32000-token draft vocabulary, float32 weights)
runs its 7 TTT steps and loss under bf16 autocast on random target features; saved_tensors_hooks record every
tensor autograd keeps, counted once per storage. Parameters are left out; the rest is split into

  layer        the draft's fc and decoder layer activations (what the checkpointing modes act on)
  head_loss    tensors with the draft vocabulary as last dimension (LM head and soft cross-entropy). On a CPU
               the loss is the reference soft cross-entropy; the Triton kernel on a GPU keeps 2 B x Vd per token
               and step instead (checkpointed by selective and full: nothing).
  weight_casts bf16 copies of the float32 weights (q/k/v and gate/up joined), kept for the weights' own
               gradients (once per forward, compiled or not; full checkpointing casts them again in the backward)
  dense_attn   the dense TTT attention's [.., T, keys] scores, probabilities and masks: the CPU's attention;
               flex attention on a GPU keeps none of them (its q, k, v, output and log-sum-exp are in `layer`)

It measures what is kept at the end of the forward, not the backward's transient peak (full checkpointing
recomputes one step at a time there).

    python tools/bench_activations.py --seq-len 256 --out runs/bench_activations.json    # CPU, about 2 minutes
    python tools/bench_activations.py --config tiny --out /tmp/activations.json
    python tools/bench_activations.py --config tiny --compile --out /tmp/activations.json    # train.compile on
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from specdraft.config import CHECKPOINTING
from specdraft.core.io import write_json
from specdraft.methods import get_method
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures, TargetInfo

TTT_STEPS = 7
CONFIGS = {
    "llama3-8b": dict(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=14336, vocab_size=32000, draft_vocab=32000, seq_len=256),
    "tiny": dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=192,
                 vocab_size=512, draft_vocab=256, seq_len=32),
}


def target_info(config: dict) -> TargetInfo:
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


def run(config_name: str, seq_len: Optional[int], modes: List[str], compile_layers: bool = False) -> dict:
    config = CONFIGS[config_name]
    seq_len = seq_len or config["seq_len"]
    info = target_info(config)
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
    return {"config": config_name, "seq_len": seq_len, "ttt_steps": TTT_STEPS, "compile": compile_layers, "draft_vocab": config["draft_vocab"],
            "hidden_size": info.hidden_size, "intermediate_size": info.intermediate_size,
            "draft_parameters": sum(p.numel() for p in draft.parameters()), "rows": rows}


def print_table(report: dict) -> None:
    mb = 1e6
    print(f"\nkept for the backward, T={report['seq_len']}, {report['ttt_steps']} TTT steps, MB (1e6 bytes)")
    print(f"{'mode':<11}{'layer':>10}{'per step':>10}{'per 1k tok/step':>17}{'dense_attn':>12}{'head_loss':>11}"
          f"{'weight_casts':>14}")
    for row in report["rows"]:
        per_thousand = row["layer_per_step"] / report["seq_len"] * 1000
        print(f"{row['mode']:<11}{row['layer'] / mb:>10.1f}{row['layer_per_step'] / mb:>10.1f}"
              f"{per_thousand / mb:>17.1f}{row['dense_attn'] / mb:>12.1f}{row['head_loss'] / mb:>11.1f}"
              f"{row['weight_casts'] / mb:>14.1f}")


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="llama3-8b")
    parser.add_argument("--seq-len", type=int, help="default: the config's (256 for the 8B)")
    parser.add_argument("--modes", nargs="+", choices=CHECKPOINTING, default=list(CHECKPOINTING))
    parser.add_argument("--compile", action="store_true", help="the draft layer's parts under torch.compile")
    parser.add_argument("--out", default="runs/bench_activations.json")
    args = parser.parse_args(argv)
    report = run(args.config, args.seq_len, args.modes, args.compile)
    print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
