"""EAGLE-3 training throughput at 1, 2 (and 4) GPUs, ZeRO-2 and ZeRO-3, through the real `specdraft train`.

The target is Llama-3.1-8B-shaped (hidden 4096, 32 layers, 32 heads, 8 KV heads, MLP 14336, vocabulary
128256, llama3 RoPE scaling) with random weights (`target.random_init`: a directory with config.json and a
tokenizer only); the data are synthetic distilled rows of 2048 tokens (the last three quarters answers). Each
(strategy, GPU count) is one `specdraft train` process (Lightning starts the ranks), micro-batch 1 per GPU, no
checkpoints. Tokens/s are measured over the steps after --warmup, from the per-step training log (the module's
cumulative tokens/s, at a known token count per step); efficiency(N) = tokens/s(N) / (N x tokens/s(1)).

    python tools/bench_scale.py --out runs/bench_scale                                # GPUs 1, 2 (4 if present)
    python tools/bench_scale.py --strategies deepspeed_stage_3 --gpus 1,2 --out DIR   # one strategy
    python tools/bench_scale.py --config tiny --device cpu --out /tmp/bench_scale     # tiny model, CPU, ddp

Prints a table and writes DIR/bench_scale.json (each run's log in DIR/logs/). On the CPU DeepSpeed is not
available (Lightning runs it on CUDA only), so the tiny CPU run measures ddp with 1 and 2 processes.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
CONFIGS = {
    "llama8b": {"target": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                               intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
                               rope_scaling=LLAMA3_ROPE, max_position_embeddings=131072, rms_norm_eps=1e-5),
                "seq_len": 2048, "draft_vocab_size": 32000, "ttt_steps": 7},
    "tiny": {"target": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, vocab_size=320, rope_theta=500000.0,
                            rope_scaling={**LLAMA3_ROPE, "original_max_position_embeddings": 256},
                            max_position_embeddings=2048, rms_norm_eps=1e-5),
             "seq_len": 128, "draft_vocab_size": 256, "ttt_steps": 7},
}


def write_target(directory: Path, shape: dict) -> Path:
    """config.json + a tokenizer with a chat template: all `target.random_init` needs."""
    from transformers import LlamaConfig

    from tests.tiny import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = LlamaConfig(**copy.deepcopy(shape), tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, architectures=["LlamaForCausalLM"])
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_rows(distill_dir: Path, num_rows: int, seq_len: int, vocab_size: int) -> Path:
    """Synthetic distilled rows in the on-disk format: random ids, the last 3/4 of each row an answer."""
    from datasets import Dataset

    from specdraft.data.format import ROW_FEATURES, dataset_dir

    ids = np.random.default_rng(0).integers(0, vocab_size, size=(num_rows, seq_len))  # [rows, T]
    mask = np.zeros(seq_len, dtype=np.int64)
    mask[seq_len // 4:] = 1
    rows = [{"input_ids": row.tolist(), "loss_mask": mask.tolist(), "source": "synthetic", "index": i, "turns": 1,
             "target": "random", "target_revision": "", "temperature": 0.0, "top_p": 1.0, "seed": 0,
             "max_new_tokens": seq_len} for i, row in enumerate(ids)]
    Dataset.from_list(rows, features=ROW_FEATURES).save_to_disk(str(dataset_dir(distill_dir)))
    return distill_dir


def write_recipe(work: Path, spec: dict, dtype: str) -> Path:
    path = work / "recipe.yaml"
    path.write_text(f"""# tools/bench_scale.py: random-weight target, synthetic rows (benchmark only)
target: {{path: {work / 'target'}, dtype: {dtype}, random_init: true}}
method: {{name: eagle3, ttt_steps: {spec['ttt_steps']}, draft_vocab_size: {spec['draft_vocab_size']}}}
data: {{max_length: {spec['seq_len']}, val_fraction: 0.01}}
distill: {{output_dir: {work / 'data'}}}
train: {{micro_batch_size: 1, lr: 1.0e-4, warmup_steps: 1, log_every_steps: 1, seed: 0}}
""")
    return path


def steady_tokens_per_s(metrics_csv: Path, tokens_per_step: int, warmup: int) -> float:
    """Tokens/s between the first logged step >= warmup and the last one. The module logs its cumulative
    tokens/s since fit start at each step s, when (s + 1) * tokens_per_step tokens have been read."""
    with open(metrics_csv) as handle:
        logged = [(int(row["step"]), float(row["train/tokens_per_s"])) for row in csv.DictReader(handle)
                  if row.get("train/tokens_per_s")]
    elapsed = {step: (step + 1) * tokens_per_step / rate for step, rate in logged}  # seconds since fit start
    first, last = min(s for s in elapsed if s >= warmup), max(elapsed)
    if last <= first:
        raise RuntimeError(f"{metrics_csv}: no logged steps after warm-up step {warmup}")
    return (last - first) * tokens_per_step / (elapsed[last] - elapsed[first])


def run_one(work: Path, recipe: Path, strategy: str, gpus: int, args, spec: dict) -> dict:
    """One `specdraft train` process; -> tokens/s after warm-up."""
    run_dir = work / "runs" / f"{strategy}-{gpus}"
    steps = args.warmup + args.steps
    overrides = [f"train.output_dir={run_dir}", f"train.strategy={strategy}", f"train.devices={gpus}",
                 f"train.max_steps={steps}", f"train.val_every_steps={steps + 1}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}", HF_HUB_OFFLINE="1")
    if args.device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    log_path = args.out / "logs" / f"{strategy}-{gpus}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        done = subprocess.run([sys.executable, "-m", "specdraft.cli", "train", str(recipe), *overrides], cwd=REPO,
                              env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{strategy} on {gpus}: exit {done.returncode}; see {log_path}")
    rate = steady_tokens_per_s(next(run_dir.glob("logs/version_*/metrics.csv")), gpus * spec["seq_len"],
                               args.warmup)
    return {"strategy": strategy, "gpus": gpus, "tokens_per_s": rate, "tokens_per_s_per_gpu": rate / gpus,
            "timed_steps": args.steps, "wall_seconds": time.perf_counter() - started}


def add_efficiency(results: list) -> list:
    for result in results:
        base = next((r for r in results if r["strategy"] == result["strategy"] and r["gpus"] == 1), None)
        result["efficiency"] = result["tokens_per_s"] / (result["gpus"] * base["tokens_per_s"]) if base else None
    return results


def table(results: list) -> str:
    lines = [f"{'strategy':<20} {'GPUs':>4} {'tokens/s':>10} {'per GPU':>9} {'efficiency':>10}"]
    for r in results:
        efficiency = f"{100 * r['efficiency']:.1f}%" if r["efficiency"] is not None else "-"
        lines.append(f"{r['strategy']:<20} {r['gpus']:>4} {r['tokens_per_s']:>10.0f} {r['tokens_per_s_per_gpu']:>9.0f} "
                     f"{efficiency:>10}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="llama8b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpus", default=None, help="GPU (process) counts, e.g. 1,2 (default 1,2 and 4 if present)")
    parser.add_argument("--strategies", default=None,
                        help="default: deepspeed_stage_2,deepspeed_stage_3 on cuda, ddp on cpu")
    parser.add_argument("--steps", type=int, default=15, help="timed steps after warm-up")
    parser.add_argument("--warmup", type=int, default=5, help="steps not timed")
    parser.add_argument("--rows", type=int, default=64, help="synthetic rows (cycled)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.gpus is None:
        import torch

        present = torch.cuda.device_count() if args.device == "cuda" else 2
        args.gpus = ",".join(str(n) for n in (1, 2, 4) if n <= max(present, 1))
    args.gpus = [int(n) for n in args.gpus.split(",")]
    default = "deepspeed_stage_2,deepspeed_stage_3" if args.device == "cuda" else "ddp"
    args.strategies = (args.strategies or default).split(",")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    spec = CONFIGS[args.config]
    work = args.out / "work"
    write_target(work / "target", spec["target"])
    write_rows(work / "data", args.rows, spec["seq_len"], spec["target"]["vocab_size"])
    recipe = write_recipe(work, spec, "bfloat16" if args.device == "cuda" else "float32")
    results = add_efficiency([run_one(work, recipe, strategy, gpus, args, spec)
                              for strategy in args.strategies for gpus in args.gpus])
    report = {"config": args.config, "device": args.device, "device_name": _device_name(args.device),
              "seq_len": spec["seq_len"], "micro_batch_per_gpu": 1, "warmup_steps": args.warmup,
              "timed_steps": args.steps, "target": spec["target"], "results": results}
    (args.out / "bench_scale.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"-> {args.out / 'bench_scale.json'}")
    return report


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
