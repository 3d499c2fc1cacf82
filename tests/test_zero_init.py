"""A draft built under DeepSpeed's zero.Init (deepspeed_stage_3: Lightning builds the draft in one) starts from
the same weights as one built plainly with the same seed. zero.Init partitions each submodule as soon as it is
built, so a draft's own re-initialization of its linear layers (N(0, init_std)) used to write into empty
tensors and be lost: ZeRO-3 runs trained from PyTorch's default initialization instead (2-3.5x the std), and
the ZeRO-3 case of tests/test_multi_gpu.py failed on the first weight it compares (fc.weight). One DeepSpeed
rank on the CPU (gloo), in a process of its own (about 10 s)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.methods import METHODS
from tests.test_methods_contract import CASES

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_drafts_built_under_zero_init_keep_their_initialization():
    pytest.importorskip("deepspeed")
    assert set(CASES) == set(METHODS)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.zero_init_run", json.dumps(CASES)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "done" in done.stdout, (done.stdout + done.stderr)[-3000:]
    differing = [line for line in done.stdout.splitlines() if line.startswith("differs")]
    assert not differing, differing
