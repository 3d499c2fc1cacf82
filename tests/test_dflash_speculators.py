"""DFlash's speculators export loaded by the `speculators` package's own DFlashDraftModel (CPU, a tiny random target):
its logits on the same target features and anchors are specdraft's, with the target's head and with a draft
vocabulary. speculators pins older transformers and datasets than the project's, so tools/setup.sh installs it
apart (--no-deps, into .venv/speculators); the check runs in a subprocess with that folder on its path, and skips,
saying why, where the package is not there or does not import."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _speculators_path() -> str:
    """SPECDRAFT_SPECULATORS_PATH, else .venv/speculators under the repository (tools/setup.sh's)."""
    return os.environ.get("SPECDRAFT_SPECULATORS_PATH", str(ROOT / ".venv" / "speculators"))


def _run(*args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT), _speculators_path(), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": path, "SPECDRAFT_KERNELS": "reference"})


@pytest.fixture(scope="module")
def speculators_importable():
    done = _run("-c", "import speculators.models.dflash")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"speculators 0.9.0 does not import from {_speculators_path()} ({last}); install it with "
                    f"bash tools/setup.sh, or point SPECDRAFT_SPECULATORS_PATH at a --target install")


@pytest.mark.parametrize("vocab", [0, 150], ids=["target_head", "draft_vocab"])
def test_speculators_dflash_model_computes_our_logits(speculators_importable, vocab):
    done = _run("-m", "tests.dflash_speculators_run", str(vocab))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shape"] == [1, 12, vocab or 320]
    assert result["max_difference"] < 1e-4 * max(1.0, result["scale"]), result
    allowed_missing = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"} | (
        {"lm_head.weight"} if not vocab else set())
    assert set(result["missing"]) <= allowed_missing and not result["unexpected"], result
