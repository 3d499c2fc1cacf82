"""Every op's launches at runtime shapes (SmolLM2-135M, Llama-3-8B, Qwen3-30B-A3B's experts) compile for an
H100/H200 (sm_90a) without spilling registers: checked on the CPU with Triton's own compiler and ptxas
(tests/kernels/sm90.py), in a subprocess without TRITON_INTERPRET."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
from tests.kernels.sm90 import _ptxas

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not os.path.exists(_ptxas()), reason="Triton's bundled ptxas is missing")
def test_runtime_launches_compile_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-m", "tests.kernels.sm90"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == 35
    assert [r for r in reports if r["spill_bytes"]] == []
