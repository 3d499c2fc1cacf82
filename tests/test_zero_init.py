"""Models built under DeepSpeed's zero.Init (ZeRO-3's partitioned construction) are the models built plainly.
One DeepSpeed rank on the CPU (gloo), in a process of its own (tests/zero_init_run.py; about 10 s each).

zero.Init partitions each submodule as soon as its own __init__ returns, and while it is active casts every
floating-point tensor that torch.arange, torch.zeros, ... make to its dtype. Two consequences once bit us:
- a draft's re-initialization of its linear layers (N(0, init_std)) wrote into empty tensors and was lost, so
  deepspeed_stage_3 runs trained from PyTorch's default initialization (2 to 3.5 times the std): the ZeRO-3 case
  of tests/test_multi_gpu.py failed on the first weight it compares (fc.weight);
- the target that train.shard_target partitions computed its rotary inv_freq in bf16, unlike the target that
  evaluation and serving run (float32)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.testing.ports import free_port
from tests.addons import DRAFT_METHODS
from tests.test_methods_contract import CASES

REPO = Path(__file__).resolve().parents[1]


def differences(*args: str, ranks: int = 1) -> list:
    """tests/zero_init_run.py on `ranks` ranks -> the differences rank 0 found."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "WORLD_SIZE": str(ranks), "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    runs = [subprocess.Popen([sys.executable, "-m", "tests.zero_init_run", *args], cwd=REPO,
                             env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for rank in range(ranks)]
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (stdout, stderr) in zip(runs, outputs):
        assert run.returncode == 0 and "done" in stdout, \
            f"exit {run.returncode}\nstdout: {stdout[-1500:]}\nstderr: {stderr[-1500:]}"
    return [line for line in outputs[0][0].splitlines() if line.startswith("differs")]


@pytest.mark.slow
def test_drafts_built_under_zero_init_keep_their_initialization():
    assert set(CASES) == set(DRAFT_METHODS)
    assert differences("drafts", json.dumps(CASES)) == []


@pytest.mark.slow
@pytest.mark.parametrize("guard", ["guard", "no-guard"])
def test_sharded_target_is_the_target_with_its_float32_rotary_frequencies(tiny_target_dir, guard):
    """no-guard: Transformers 5.17 (the GPU machine's) lacks prevent_arange_dtype_change; the loader's rebuilt
    rotary buffers must give the same target."""
    assert differences("target", str(tiny_target_dir), guard) == []


@pytest.mark.slow
def test_drafts_train_under_the_zero3_engine_as_built_plainly():
    """Every method's loss and gradients under DeepSpeed's ZeRO-3 engine equal the plain draft's (the EAGLE-3
    layer reads its submodules' weights directly, one joined q/k/v matmul: DeepSpeed must gather them)."""
    assert differences("losses", json.dumps(CASES)) == []


@pytest.mark.slow
def test_zero3_on_two_ranks_trains_as_one_process_and_gathers_each_weight_once_per_step():
    """2 ranks, one row each (identical rows): the weights after 3 steps equal the plain draft's trained on
    both rows in one process; after DeepSpeed's first (recording) step, a step all-gathers no more elements
    than the draft's weights hold, though the TTT unrolls call the draft layer once each. Called without a
    module forward around the loss (as a hand-written loop might), DeepSpeed never completes its trace and
    EAGLE-3 with 7 unrolls gathers its weights about 7.8 times a step."""
    cases = {"eagle3": {"ttt_steps": 7, "draft_vocab_size": 256}, "poss": CASES["poss"]}
    assert differences("two_ranks", json.dumps(cases), ranks=2) == []


@pytest.mark.slow
def test_zero3_with_whole_weights_trains_without_module_hooks_or_gathers():
    """train.zero3_persist (specdraft.train.zero3), on 2 ranks: every draft's weights persistent and whole, no
    ZeRO-3 hook on any module of the engine or of the frozen target held beside it, PyTorch's linear, no all-gather
    in a forward or backward, the weights still whole after the validation's `gathered` read and a `gathered`
    write (before, DeepSpeed's context partitioned them on exit and nothing gathered them again) and after a
    checkpoint's save and load, and after 3 steps the plain draft's weights. P-EAGLE keeps every column and DFlash
    anchors every position here: their draws run over the rows they are given, which two ranks of one row each
    split differently."""
    cases = {**CASES, "peagle": {**CASES["peagle"], "keep_ratio": 1.0, "keep_floor": 1.0},
             "dflash": {**CASES["dflash"], "num_anchors": 16}}  # the test rows' 16 columns
    assert differences("whole_weights", json.dumps(cases), ranks=2) == []
