"""A ZeRO checkpoint resumed on another number of ranks through DeepSpeed's universal checkpoint: the layout
read from the checkpoint, the conversion, and one more AdamW step that equals the step the saving world size
takes (so the Adam moments came back, not just the weights). DeepSpeed engines on the CPU (gloo), no GPU,
several processes (about 30 s). The same path through Lightning on GPUs: tests/test_multi_gpu.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdraft.train.resharding import (
    UNIVERSAL_TAG,
    ZeroLayout,
    convert_to_universal,
    universal_is_current,
    zero_layout,
)
from specdraft.testing.ports import free_port

REPO = Path(__file__).resolve().parents[1]


def run_ranks(world: int, *args) -> None:
    """tests/zero_run.py on `world` ranks at once; fails with their output if any rank fails."""
    port = str(free_port())
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_PORT": port, "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-m", "tests.zero_run", *map(str, args)], cwd=REPO,
                              env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(world)]
    outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    for rank, output in zip(ranks, outputs):
        assert rank.returncode == 0, output[-3000:]


def resharded_step(tmp_path, stage: int, saved_world: int, resumed_world: int):
    """Save on `saved_world` ranks, take the next step there and, through the universal checkpoint, on
    `resumed_world` -> (the same-world step's weights, the resharded step's, the saved weights)."""
    checkpoint = tmp_path / "last.ckpt"
    run_ranks(saved_world, "save", stage, checkpoint, "-")
    assert zero_layout(checkpoint) == ZeroLayout(world_size=saved_world, stage=stage)
    run_ranks(saved_world, "step", stage, checkpoint, tmp_path / "same_world.pt")
    assert not universal_is_current(checkpoint)
    convert_to_universal(checkpoint, workers=1)
    assert universal_is_current(checkpoint) and (checkpoint / "latest_universal").read_text() == UNIVERSAL_TAG
    assert not list(checkpoint.glob(".tmp-*"))
    run_ranks(resumed_world, "step_universal", stage, checkpoint, tmp_path / "resharded.pt")
    saved = torch.load(next((checkpoint / "checkpoint").glob("*model_states.pt")), weights_only=False)["module"]
    return torch.load(tmp_path / "same_world.pt"), torch.load(tmp_path / "resharded.pt"), saved


@pytest.mark.slow
@pytest.mark.parametrize("stage, saved_world, resumed_world", [(2, 1, 2), (3, 2, 1)])
def test_resume_zero_checkpoint_on_another_world_size(tmp_path, stage, saved_world, resumed_world):
    expected, resharded, saved = resharded_step(tmp_path, stage, saved_world, resumed_world)
    for name, weight in expected.items():
        assert not torch.equal(weight, saved[name].float()) or stage == 3, name  # the step moved it
        torch.testing.assert_close(resharded[name], weight, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_resume_8bit_moments_on_another_world_size(tmp_path, monkeypatch):
    """AdamW8bitFused (train.optimizer=adamw8bit_fused, the default on CUDA) through the universal checkpoint:
    its 8-bit moments go in as float32 and are quantized again after the load, in the blocks of the new
    partitions. Saved on 2 ranks, resumed on 1 (the worker checks every moment is 8-bit again): the step is the
    2-rank run's up to that rounding, a few percent of the step at most."""
    monkeypatch.setenv("ZERO_RUN_OPTIMIZER", "adamw8bit_fused")
    expected, resharded, saved = resharded_step(tmp_path, 2, 2, 1)
    for name, weight in expected.items():
        step = (weight - saved[name].float()).abs().max()
        assert step > 0 and (resharded[name] - weight).abs().max() <= 0.05 * step, name
