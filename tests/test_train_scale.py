"""Training across world sizes and under SLURM, CPU parts: the global data position, which checkpoint
train.resume=auto picks, Lightning's SLURM plugin, and a DDP run resumed on another number of processes."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from lightning.pytorch.plugins.environments import SLURMEnvironment

from specdraft.config import TrainConfig
from specdraft.core.errors import SpecdraftError
from specdraft.train.checkpoints import AtomicCheckpointIO
from specdraft.train.data import ResumableSampler
from specdraft.train.trainer import check_resume_format, trainer_plugins, resume_path
from tests.test_train_export_eval import make_recipe

REPO = Path(__file__).resolve().parents[1]


def read(rows: int, world: int, total: int, start: int = 0, done: int = 0, seed: int = 3) -> list:
    """Per rank, the rows a ResumableSampler yields."""
    indices = np.arange(100, 100 + rows)
    return [list(ResumableSampler(indices, seed, total, lambda: (start, done), lambda r=rank: r, lambda: world))
            for rank in range(world)]


def interleave(per_rank: list) -> list:
    """The global stream: position p is rank p % world's (p // world)-th sample."""
    return [row for step in zip(*per_rank) for row in step]


def test_resumed_sampler_continues_the_stream():
    whole = read(rows=10, world=2, total=12)
    resumed = read(rows=10, world=2, total=12, start=2 * 5, done=5)
    assert [rank[5:] for rank in whole] == resumed
    assert sorted(interleave(whole)[:10]) == list(range(100, 110))  # one epoch: every row once


def test_another_world_size_reads_the_rest_of_the_stream():
    stream = interleave(read(rows=12, world=1, total=36))  # epochs of 12 on one rank
    before = interleave(read(rows=12, world=2, total=4))  # 2 ranks read global positions 0..7
    after = interleave(read(rows=12, world=3, total=4, start=8, done=0))  # 3 ranks continue at 8..19
    assert before + after == stream[:20]


def test_too_few_rows_for_the_ranks():
    with pytest.raises(SpecdraftError, match="3 training rows cannot feed 4 ranks"):
        read(rows=3, world=4, total=1)


def test_resume_auto_picks_the_newest_checkpoint(tmp_path):
    cfg = TrainConfig(resume="auto")
    assert resume_path(cfg, tmp_path) is None
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"x")
    assert resume_path(cfg, tmp_path) == str(last)
    hpc = tmp_path / "hpc_ckpt_1.ckpt"
    hpc.write_bytes(b"x")
    os.utime(last, (time.time() - 60, time.time() - 60))
    assert resume_path(cfg, tmp_path) == str(hpc)  # SIGUSR1 saved after the last periodic checkpoint
    os.utime(hpc, (time.time() - 120, time.time() - 120))
    assert resume_path(cfg, tmp_path) == str(last)
    deepspeed_dir = tmp_path / "hpc_ckpt_2.ckpt"  # a DeepSpeed checkpoint: a directory written in place
    (deepspeed_dir / "checkpoint").mkdir(parents=True)
    os.utime(deepspeed_dir, (time.time() - 300, time.time() - 300))
    (deepspeed_dir / "latest").write_text("checkpoint")
    assert resume_path(cfg, tmp_path) == str(deepspeed_dir)
    with pytest.raises(SpecdraftError, match="saved by a DeepSpeed strategy; train.strategy=ddp cannot resume"):
        check_resume_format(TrainConfig(strategy="ddp"), str(deepspeed_dir))
    with pytest.raises(SpecdraftError, match="saved by auto or ddp; train.strategy=deepspeed_stage_2 cannot"):
        check_resume_format(TrainConfig(strategy="deepspeed_stage_2"), str(last))


def test_slurm_plugin_only_under_srun(monkeypatch):
    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    assert [type(p) for p in trainer_plugins()] == [AtomicCheckpointIO]
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "specdraft-train")
    atomic, plugin = trainer_plugins()
    assert isinstance(atomic, AtomicCheckpointIO) and isinstance(plugin, SLURMEnvironment)
    assert plugin.auto_requeue and plugin.requeue_signal == signal.SIGUSR1


def _train(recipe_path: Path, *overrides: str) -> None:
    """`specdraft train` in a subprocess (Lightning starts the other DDP ranks as copies of this command)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    done = subprocess.run([sys.executable, "-m", "specdraft.cli", "train", str(recipe_path), *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.slow
def test_ddp_resumes_on_another_number_of_processes(tmp_path, tiny_target_dir, distilled):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=4, val_every_steps=2,
                              micro_batch_size=2, strategy="ddp", resume="auto")
    _train(recipe_path, "train.devices=1")
    log = _train(recipe_path, "train.devices=2", "train.max_steps=8")
    assert "at step 4: draft weights, AdamW state (full state, saved at world size 1, loaded at world size 2)" \
        in log
    assert "data position (global sample 8)" in log
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 8
