"""target.quantization=8bit|4bit (bitsandbytes' frozen target for training features): recipe checks and a clean error
on the CPU; on a CUDA GPU (marker `gpu`), a few training steps with each setting on the tiny target, online and
offline. The weight-only int8/int4 target of every stage: tests/test_quantized_target.py."""
import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft import cli
from specdraft.recipes import load_recipe
from specdraft.core.errors import SpecdraftError
from specdraft.targets import load_target
from specdraft.train.trainer import run_train
from tests.test_train_export_eval import make_recipe


def test_bad_quantization_names_the_valid_ones(tmp_path, tiny_target_dir, distilled):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled)
    with pytest.raises(SpecdraftError, match="unknown target.quantization '2bit'; valid: none, int8, int4, 8bit, 4bit"):
        load_recipe(recipe_path, ["target.quantization=2bit"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only check")
def test_quantization_without_cuda_is_a_one_line_error(tmp_path, tiny_target_dir, distilled, capsys):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2)
    assert cli.main(["train", str(recipe_path), "target.quantization=4bit"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("specdraft: error: target.quantization=4bit needs a CUDA GPU")
    assert "valid: none, int8, int4, 8bit, 4bit" in last
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("quantization, linear", [("8bit", "Linear8bitLt"), ("4bit", "Linear4bit")])
def test_quantized_target_trains(tmp_path, tiny_target_dir, distilled, quantization, linear):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=4, val_every_steps=2)
    recipe = load_recipe(recipe_path, [f"target.quantization={quantization}"])
    target = load_target(recipe.target, "cuda", quantize=True)
    assert type(target.model.model.layers[0].self_attn.q_proj).__name__ == linear
    assert run_train(recipe)["steps"] == 4
    meta = json.loads((tmp_path / "run" / "last" / "meta.json").read_text())
    assert meta["metrics"]["val/tau_sim"] >= 1.0
    weights = load_file(tmp_path / "run" / "last" / "draft.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())


@pytest.mark.gpu
def test_quantized_offline_features(tmp_path, tiny_target_dir, distilled):
    import shutil

    from specdraft.distill.features import dump_features

    shutil.copytree(distilled, tmp_path / "data")
    recipe_path = make_recipe(tmp_path, tiny_target_dir, tmp_path / "data", max_steps=2, val_every_steps=2)
    overrides = ["target.quantization=8bit", "data.features=offline"]
    dump_features(load_recipe(recipe_path, overrides), tmp_path / "data")
    manifest = json.loads((tmp_path / "data" / "features" / "manifest.json").read_text())
    assert manifest["quantization"] == "8bit" and manifest["dtype"] == "bfloat16"
    assert run_train(load_recipe(recipe_path, overrides))["steps"] == 2
    with pytest.raises(SpecdraftError, match="features come from quantization=8bit"):
        run_train(load_recipe(recipe_path, ["data.features=offline"]))


def test_bench_quantization_tool_runs_tiny(tmp_path, tiny_target_dir, distilled):
    """The quantization suite (tools/bench/quantization.py) on the CPU with setting none only: its re-validation
    against the unquantized target gives the trainer's own val/tau_sim (same draft, split and teacher)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled)
    result = subprocess.run([sys.executable, "-m", "tools.bench.quantization", str(recipe_path),
                             "--work", str(tmp_path / "work"), "--settings", "none", "--steps", "4",
                             "--micro-batch", "2"], cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "val τ_sim vs bf16" in result.stdout
    report = json.loads((tmp_path / "work" / "quantization.json").read_text())
    row = report["settings"][0]
    assert row["setting"] == "none" and row["steps"] == 4 and row["val_rows"] == 2
    assert row["val_tau_sim_vs_unquantized"] == pytest.approx(row["val_tau_sim_logged"], abs=1e-6)
