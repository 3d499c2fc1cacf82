"""The last step is validated and checkpointed when max_steps is not a multiple of val_every_steps."""
import json

from specdraft.recipes import load_recipe
from specdraft.train.trainer import run_train
from tests.test_train_export_eval import make_recipe


def test_last_step_is_validated_and_snapshotted(tmp_path, tiny_target_dir, distilled):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=7, val_every_steps=5, log_every_steps=1)
    summary = run_train(load_recipe(recipe))
    assert summary["steps"] == 7
    last = json.loads((tmp_path / "run" / "last" / "meta.json").read_text())
    assert last["step"] == 7  # the final weights were validated and snapshotted, not step 5's
    assert "val/tau_sim" in json.dumps(last)


def test_last_step_is_checkpointed_and_resumes(tmp_path, tiny_target_dir, distilled, caplog):
    import logging

    import torch

    recipe = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=7, val_every_steps=5, resume="auto")
    run_train(load_recipe(recipe))
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert last["global_step"] == 7
    with caplog.at_level(logging.INFO, logger="specdraft.train.trainer"):
        assert run_train(load_recipe(recipe, ["train.max_steps=9"]))["steps"] == 9
    assert "at step 7:" in caplog.text  # resumed from the last step, not from step 5's checkpoint
