"""A killed and resumed training run equals the uninterrupted one (best/, last/ and every RNG), and a resume with a
changed recipe is refused in one line naming the keys, except for the keys documented as safe. CPU, tiny random
target, under a minute each."""
import json
import random
import shutil
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specdraft import cli
from specdraft.recipes import load_recipe
from specdraft.train.checkpoints import RESUME_SAFE, recipe_changes, resume_safe
from specdraft.train.module import DraftModule
from specdraft.train.trainer import run_train
from tests.test_hostile_files import one_line_error, tree
from tests.test_train_export_eval import make_recipe


class Crash(L.Callback):
    """A crash (as a kill would stop the run) right after optimizer step `step`."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


class FinalRng(L.Callback):
    """Every RNG's state when the fit ends."""

    def on_train_end(self, trainer, pl_module):
        self.states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()[1].copy(),
                       "python": random.getstate()}


@pytest.fixture
def falling_score(monkeypatch):
    """Each validation scores lower than the one before: best/ must stay at the first validation's weights."""
    def log_falling(self):
        self._val_metrics.clear()
        self.log("val/tau_sim", 10.0 - self.trainer.global_step / 100, sync_dist=True)

    monkeypatch.setattr(DraftModule, "on_validation_epoch_end", log_falling)


def run(recipe, *callbacks):
    rng = FinalRng()
    run_train(load_recipe(recipe), extra_callbacks=[*callbacks, rng])
    return rng.states


def test_killed_and_resumed_run_equals_the_uninterrupted_one(tmp_path, tiny_target_dir, distilled, falling_score):
    settings = dict(max_steps=12, val_every_steps=4, resume="auto")
    (tmp_path / "a").mkdir()
    straight = run(make_recipe(tmp_path / "a", tiny_target_dir, distilled, **settings))
    (tmp_path / "b").mkdir()
    resumed_recipe = make_recipe(tmp_path / "b", tiny_target_dir, distilled, **settings)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(resumed_recipe, Crash(6))  # its last checkpoint: step 4, after step 4's validation
    resumed = run(resumed_recipe)
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    for name in ("best", "last"):
        assert json.loads((a / name / "meta.json").read_text()) == json.loads((b / name / "meta.json").read_text())
        weights_a, weights_b = load_file(a / name / "draft.safetensors"), load_file(b / name / "draft.safetensors")
        assert weights_a.keys() == weights_b.keys()
        for tensor in weights_a:
            assert torch.equal(weights_a[tensor], weights_b[tensor]), (name, tensor)
    assert json.loads((a / "best" / "meta.json").read_text())["step"] == 4  # the falling score kept step 4's
    assert torch.equal(straight["torch"], resumed["torch"])
    assert (straight["numpy"] == resumed["numpy"]).all() and straight["python"] == resumed["python"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, tiny_target_dir, distilled):
    """A 2-step run with its checkpoint, made once; each test resumes a copy."""
    base = tmp_path_factory.mktemp("resume_run")
    assert cli.main(["train", str(make_recipe(base, tiny_target_dir, distilled, max_steps=2,
                                              val_every_steps=2))]) == 0
    return base / "run"


@pytest.fixture
def resumable(tmp_path, short_run, tiny_target_dir, distilled):
    shutil.copytree(short_run, tmp_path / "run")
    return make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2, resume="auto")


@pytest.mark.parametrize("override, key", [
    ("method.ttt_steps=2", "method.ttt_steps"),
    ("train.lr=0.001", "train.lr"),
    ("train.micro_batch_size=2", "train.micro_batch_size"),
    ("method.draft_vocab_size=128", "method.draft_vocab_size"),
    ("data.max_length=64", "data.max_length"),
])
def test_a_changed_recipe_is_refused_naming_the_key(tmp_path, resumable, capsys, override, key):
    before = tree(tmp_path / "run")
    one_line_error(capsys, ["train", resumable, override], "refusing to resume", "last.ckpt", f"changes {key} ",
                   "docs/training.md")
    assert tree(tmp_path / "run") == before  # recipe.yaml untouched


def test_safe_changes_resume(tmp_path, resumable, capsys):
    argv = ["train", str(resumable), "train.max_steps=4", "train.log_every_steps=1", "train.val_every_steps=4",
            "eval.max_new_tokens=8", "runtime.depth=3", f"train.output_dir={tmp_path / 'run'}/"]
    assert cli.main(argv) == 0
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["steps"] == 4
    assert "max_steps: 4" in (tmp_path / "run" / "recipe.yaml").read_text()  # the safe change recorded


def test_the_checkpoint_carries_its_recipe(tmp_path, resumable, capsys):
    """A checkpoint resumed from elsewhere (train.resume=PATH) is compared with the recipe it was trained with."""
    moved = tmp_path / "elsewhere.ckpt"
    shutil.copy(tmp_path / "run" / "checkpoints" / "last.ckpt", moved)
    (tmp_path / "run" / "recipe.yaml").unlink()
    one_line_error(capsys, ["train", resumable, f"train.resume={moved}", "train.lr=0.5"],
                   f"refusing to resume {moved}", "changes train.lr", "(the recipe saved in it)")


def test_resume_safe_keys():
    assert resume_safe("train.max_steps") and resume_safe("eval.max_prompts") and resume_safe("runtime.topk")
    assert not resume_safe("distill.output_dir") and not resume_safe("train.lr") and not resume_safe("train.seed")
    assert all(resume_safe(key) for key in RESUME_SAFE)


def test_recipe_changes_lists_every_unsafe_key(tmp_path, tiny_target_dir, distilled):
    from specdraft.recipes import recipe_to_yaml

    recipe = load_recipe(make_recipe(tmp_path, tiny_target_dir, distilled))
    changed = load_recipe(make_recipe(tmp_path, tiny_target_dir, distilled), ["train.lr=0.5", "train.seed=3",
                                                                               "train.max_steps=99"])
    assert recipe_changes(recipe_to_yaml(recipe), changed) == ["train.lr", "train.seed"]


def test_the_safe_keys_are_documented():
    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    for key, why in RESUME_SAFE.items():
        assert f"| `{key}` | {why} |" in text, key
