"""tools/gpu/methods45.sh (the PosS / Kangaroo GPU comparison) end to end in a tiny CPU configuration: the tiny
random target stands in for SmolLM2, two training steps per run, one prompt benched as a chain. Minutes on 2 cores."""
import json
import os
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_methods45_script_trains_then_benches_and_plots(tmp_path, tiny_target_dir, distilled):
    """STAGES=train on every run first, then STAGES=bench with BENCH_TAG: what Session 15 does to bench each draft
    on an idle host after training four at once."""
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text(json.dumps({"turns": ["question?"]}) + "\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "WORK": str(tmp_path), "GGUF": str(tiny_target_dir), "DATA": str(distilled),
           "RUNS": "poss1 kangaroo2", "STEPS": "2", "TREE": "0", "MAX_PROMPTS": "1", "EVAL_TOKENS": "12",
           "EVAL_PROMPTS": str(prompts), "TRITON_INTERPRET": "0", "SPECDRAFT_KERNELS": "reference",  # plain CPU
           "KANGAROO_ETAS": "0 0.5"}
    trained = subprocess.run(["bash", "tools/gpu/methods45.sh", "train.micro_batch_size=2"], cwd=ROOT,
                             env={**env, "STAGES": "train"}, capture_output=True, text=True)
    assert trained.returncode == 0, trained.stderr[-3000:]
    root = tmp_path / "methods45"
    assert (root / "poss1" / "export" / "config.json").exists() and not list(root.glob("*/bench_*"))
    result = subprocess.run(["bash", "tools/gpu/methods45.sh"], cwd=ROOT, env={**env, "STAGES": "bench",
                            "BENCH_TAG": "_alone"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train" not in {line.split()[2] for line in result.stdout.splitlines() if line.startswith("=== ")
                           and len(line.split()) > 2}
    assert (root / "poss1" / "bench_chain_alone" / "bench.json").exists()
    summary = json.loads((root / "acceptance_chain_alone.json").read_text())
    assert list(summary) == ["poss1", "kangaroo2"] and all(run["lossless"] for run in summary.values())
    assert all(len(run["acceptance_by_position"]) == 6 for run in summary.values())
    assert not (root / "acceptance_tree_alone.json").exists()  # TREE=0
    config = json.loads((root / "poss1" / "export" / "config.json").read_text())
    assert config["poss_config"]["specialist_by_depth"] == [0, 1, 2, 3, 4, 5, 5]
    assert json.loads((root / "kangaroo2" / "params.json").read_text())["trainable_params"] > 0
    assert "| kangaroo2 |" in result.stdout
    sweep = json.loads((root / "kangaroo_sweep_alone" / "sweep.json").read_text())["rows"]
    assert [(row["exit_layer"], row["eta"]) for row in sweep] == [("2", 0.0), ("2", 0.5)]


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "tools" / "gpu").glob("*.sh")))
def test_gpu_scripts_parse(script):
    """Every GPU script at least parses (they run only on the lent machines, where a syntax error costs a call)."""
    result = subprocess.run(["bash", "-n", f"tools/gpu/{script}"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
