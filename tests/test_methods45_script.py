"""tools/gpu/methods45.sh (the PosS / Kangaroo GPU comparison) end to end in a tiny CPU configuration: the tiny
random target stands in for SmolLM2, two training steps per run. About 90 s on 2 cores."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_methods45_script_runs_every_kind_of_run(tmp_path, tiny_target_dir, distilled):
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(json.dumps({"turns": ["question?"]}) + "\n")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "WORK": str(tmp_path),
           "GGUF": str(tiny_target_dir), "DATA": str(distilled), "RUNS": "poss1 kangaroo2", "STEPS": "2",
           "MB": "2", "MAX_PROMPTS": "1", "EVAL_TOKENS": "12", "EVAL_PROMPTS": str(prompts)}
    result = subprocess.run(["bash", "tools/gpu/methods45.sh", "train.val_every_steps=2"], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "methods45" / "acceptance.json").read_text())
    assert list(summary) == ["poss1", "kangaroo2"]
    assert all(run["lossless"] for run in summary.values())
    config = json.loads((tmp_path / "methods45" / "poss1" / "export" / "config.json").read_text())
    assert config["poss_config"]["specialist_by_depth"] == [0, 1, 2, 3, 4, 5, 5]
    assert "| kangaroo2 |" in result.stdout
