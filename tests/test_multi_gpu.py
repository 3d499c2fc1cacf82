"""Resuming a run on another number of GPUs (marker `gpu`; needs 2 GPUs): ZeRO-2 and ZeRO-3 through DeepSpeed's
universal checkpoint, and DDP. Each case trains 2 steps on A GPUs, then continues to step 4 from a copy of the
run on A GPUs (the reference) and on B GPUs, with the same global batch (4 rows: micro-batch 4 / GPUs). The two
must agree: the B run's last two updates within 5% of the reference's (losing the AdamW moments would change
them by far more). Float32 draft. Three `specdraft train` processes per case, about a minute on an H100 pair.

    python -m pytest -q tests/test_multi_gpu.py -k deepspeed_stage_2     # both directions
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.test_train_export_eval import make_recipe

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 4

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (torch.cuda.device_count() < 2)")]


def train(recipe_path: Path, gpus: int, *overrides: str) -> str:
    """`specdraft train` on `gpus` GPUs (Lightning starts the ranks) -> its log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    argv = [sys.executable, "-m", "specdraft.cli", "train", str(recipe_path), f"train.devices={gpus}",
            f"train.micro_batch_size={GLOBAL_BATCH // gpus}", *overrides]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def resume_message(strategy: str, first: int, second: int) -> str:
    """How the trainer's log line says the AdamW state came back."""
    if strategy == "ddp":
        return f"full state, saved at world size {first}, loaded at world size {second}"
    if first == second:
        return f"ZeRO partitions loaded as saved, world size {second}"
    return (f"ZeRO-{strategy[-1]} partitions of world size {first} re-partitioned for world size {second} "
            f"through a DeepSpeed universal checkpoint")


@pytest.mark.parametrize("strategy", ["deepspeed_stage_2", "deepspeed_stage_3", "ddp"])
@pytest.mark.parametrize("first, second", [(1, 2), (2, 1)], ids=["1to2", "2to1"])
def test_resume_on_another_number_of_gpus(tmp_path, tiny_target_dir, distilled, strategy, first, second):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2,
                              strategy=strategy, resume="auto", precision="32-true")
    run, reference = tmp_path / "run", tmp_path / "reference"
    train(recipe_path, first)
    shutil.copytree(run, reference)
    at_step_2 = load_file(run / "last" / "draft.safetensors")
    reference_log = train(recipe_path, first, "train.max_steps=4", f"train.output_dir={reference}")
    log = train(recipe_path, second, "train.max_steps=4")
    assert f"at step 2: draft weights, AdamW state ({resume_message(strategy, first, first)})" in reference_log
    assert f"at step 2: draft weights, AdamW state ({resume_message(strategy, first, second)})" in log
    assert "data position (global sample 8)" in log
    expected, resumed = (load_file(path / "last" / "draft.safetensors") for path in (reference, run))
    for name, weight in expected.items():
        if not weight.is_floating_point():
            assert torch.equal(resumed[name], weight), name
            continue
        update = (weight - at_step_2[name]).abs().mean()
        assert update > 0, name
        assert (resumed[name] - weight).abs().mean() <= 0.05 * update, name
