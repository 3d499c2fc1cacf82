"""The defaults suite, tools/bench/defaults.py, on a tiny target on the CPU: distill once (the static engine),
four short trainings (plain settings and the fast defaults, two seeds each, two processes at a time), each benched in the runtime; the per-run table and the verdict."""
import json

import pytest

from tests.test_train_export_eval import make_recipe
from tools.bench import defaults


@pytest.mark.slow
def test_tiny_run(tmp_path, tiny_target_dir, distilled, capsys):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, log_every_steps=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"count to {i}"}) + "\n" for i in range(10)))
    out, work = tmp_path / "out", tmp_path / "work"
    report = defaults.main(["--recipe", str(recipe), "--prompts", str(prompts), "--max-prompts", "8",
                            "--distill-batch", "4", "--steps", "4", "--micro-batch", "2", "--parallel", "2",
                            "--eval-file", str(tmp_path / "eval.jsonl"), "--eval-prompts", "1",
                            "--eval-max-new-tokens", "4", "--out", str(out), "--work", str(work), "--",
                            "distill.max_new_tokens=16"])
    assert json.loads((out / "defaults.json").read_text())["runs"] == report["runs"]
    assert sorted(path.name for path in out.iterdir()) == ["defaults.json", "logs"]
    assert json.loads((work / "data" / "counts.json").read_text())["ok"] == 8
    assert [r["run"] for r in report["runs"]] == ["plain-s0", "plain-s1", "defaults-s0", "defaults-s1"]
    for run in report["runs"]:
        assert run["train_exit"] == 0 and run["bench_exit"] == 0 and run["steps"] == 4, run
        assert run["tau_sim"] >= 1.0 and run["tau"] >= 1.0 and run["steps_per_s"] > 0
    saved = (work / "runs" / "plain-s1" / "recipe.yaml").read_text()
    assert "optimizer: adamw\n" in saved and "activation_checkpointing: none" in saved and "seed: 1" in saved
    assert "cuda_graphs: 'false'" in saved
    assert "activation_checkpointing: swiglu" in (work / "runs" / "defaults-s0" / "recipe.yaml").read_text()
    for measure in ("tau_sim", "tau", "steps_per_s"):
        assert report["verdict"][measure]["verdict"] in ("within noise", "better", "worse")
    assert "| held-out τ_sim |" in capsys.readouterr().out
