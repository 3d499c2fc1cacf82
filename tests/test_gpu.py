"""Training strategies on a CUDA GPU (DeepSpeed ZeRO 1/2/3 through Lightning, DDP), resume and export.
Runs only where CUDA is (marker `gpu`); tiny target, seconds each."""
import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft import cli
from specdraft.recipes import load_recipe
from specdraft.train.trainer import run_train
from tests.test_train_export_eval import make_recipe


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3", "ddp"])
def test_strategy_trains_resumes_and_exports(tmp_path, tiny_target_dir, distilled, strategy):
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=4, val_every_steps=2,
                              strategy=strategy, resume="auto")
    assert run_train(load_recipe(recipe_path))["steps"] == 4
    assert run_train(load_recipe(recipe_path, ["train.max_steps=6"]))["steps"] == 6
    meta = json.loads((tmp_path / "run" / "last" / "meta.json").read_text())
    assert meta["step"] == 6
    weights = load_file(tmp_path / "run" / "last" / "draft.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())
    assert weights["fc.weight"].abs().sum() > 0  # gathered, not an empty ZeRO-3 partition
    assert cli.main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
