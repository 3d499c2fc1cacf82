"""What a scaling run starts, shared by its suites (tools/bench/scale.py, tools/bench/train_cli.py): the
random-weight targets at real shapes and their synthetic distilled rows (CONFIGS, write_target, write_rows), and the
training processes, each in a process group of its own with NVLink multicast off (train_env, run_process_group)."""
from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Optional

import numpy as np

from tools.bench.suite import REPO, child_env, kill_group

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
CONFIGS = {
    "llama8b": {"target": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                               intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
                               rope_scaling=LLAMA3_ROPE, max_position_embeddings=131072, rms_norm_eps=1e-5),
                "seq_len": 2048, "draft_vocab_size": 32000, "ttt_steps": 7},
    "smollm2": {"target": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                               intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
                               max_position_embeddings=8192, rms_norm_eps=1e-5),
                "seq_len": 1024, "draft_vocab_size": 8192, "ttt_steps": 7},
    "tiny": {"target": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, vocab_size=320, rope_theta=500000.0,
                            rope_scaling={**LLAMA3_ROPE, "original_max_position_embeddings": 256},
                            max_position_embeddings=2048, rms_norm_eps=1e-5),
             "seq_len": 128, "draft_vocab_size": 256, "ttt_steps": 7},
}


def write_target(directory: Path, shape: dict) -> Path:
    """config.json + a tokenizer with a chat template: all `target.random_init` needs."""
    from transformers import LlamaConfig

    from specdraft.testing.tiny import byte_tokenizer

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


MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast off in NCCL, PyTorch's symmetric memory and NVSHMEM, in every process the suite starts (a
program using it can take a shared host's GPUs out of service: tools/gpu/README.md)."""


def train_env(device: str, channels: Optional[int] = None) -> dict:
    """The environment of a configuration's `specdraft train` process: NVLink multicast off, NCCL_MAX_NCHANNELS
    when `channels` is given (else whatever this environment says), and on a CPU no GPU and one thread each."""
    env = child_env(drop=["SLURM_"], HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **MULTICAST_OFF)
    if channels:
        env["NCCL_MAX_NCHANNELS"] = str(channels)
    if device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def run_process_group(argv: list, env: dict, log, timeout: float) -> int:
    """Run `argv` in a process group of its own -> its exit code; whatever is left of the group afterwards (the
    ranks Lightning started, after a crash or the timeout) is killed, so the GPUs are free for the next run.
    Raises subprocess.TimeoutExpired after `timeout` seconds."""
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        return process.wait(timeout=timeout)
    finally:
        kill_group(process)


def log_tail(path: Path, lines: int = 8) -> str:
    """The last `lines` lines of a run's log ("" before it exists)."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
