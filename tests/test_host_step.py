"""tools/host_step.py: a `specdraft train` step's host work by region, ZeRO-2 on the CPU (gloo), tiny target."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdraft.testing.ports import free_port
from tools import host_step

REPO = Path(__file__).resolve().parents[1]


def test_the_table_leaves_the_loop_what_no_region_holds():
    regions = SimpleNamespace(seconds={"forward": 0.2, "backward": 0.3, "grad hooks": 0.01, "engine.step": 0.05,
                                       "callbacks": 0.01, "next batch": 0.02})
    ms = host_step.table(regions, wall=0.6, steps=2)
    assert ms["step"] == pytest.approx(300.0) and ms["forward"] == pytest.approx(100.0) and ms["epilogue"] == 0.0
    assert ms["loop rest"] == pytest.approx(10.0)  # within-backward regions are not subtracted twice


def test_a_zero2_run_on_the_cpu_times_every_region(tmp_path):
    env = {**os.environ, "MASTER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, "-m", "tools.host_step", "--warmup", "2", "--steps", "3",
                           "--work", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ms = json.loads(done.stdout.strip().splitlines()[-1])
    for region in ("forward", "backward", "grad hooks", "epilogue", "engine.step", "optimizer", "callbacks",
                   "next batch"):
        assert ms[region] > 0, region  # each wrapped function ran under ZeRO-2 in the timed steps
    assert ms["backward"] > ms["grad hooks"] + ms["epilogue"] and ms["engine.step"] > ms["optimizer"]
    assert ms["loop rest"] > 0 and "| loop rest |" in done.stdout
