"""The acceptance suite, tools/bench/acceptance.py, on a tiny target and its distilled rows, CPU: an EAGLE-3 and a
Kangaroo run trained two steps each on the same data, exported and evaluated; their table and JSON."""
import json

import pytest

from tests.test_train_export_eval import make_recipe
from tools.bench import acceptance as suite


def test_every_run_trains_exports_and_evaluates_on_the_same_data(tmp_path, tiny_target_dir, distilled, capsys):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    eagle3 = make_recipe(recipes, tiny_target_dir, distilled)
    eagle3.rename(recipes / "eagle3_smollm2.yaml")
    kangaroo = (recipes / "eagle3_smollm2.yaml").read_text().replace("name: eagle3", "name: kangaroo")
    (recipes / "kangaroo_smollm2.yaml").write_text(kangaroo)
    report = suite.main(["train.max_steps=2", "train.val_every_steps=2", "eval.max_prompts=1",
                         "eval.max_new_tokens=8", "--runs", "eagle3", "kangaroo1:train.lr=1e-3", "--recipes",
                         str(recipes), "--data", str(distilled), "--work", str(tmp_path / "work")])
    assert [run["run"] for run in report["runs"]] == ["eagle3", "kangaroo1"]
    for run in report["runs"]:
        assert run["train_steps"] == 2 and run["trainable_params"] > 0 and run["eval_tau"] >= 1.0
        assert run["eval_lossless"] is True and run["eval_prompts"] == 1 and len(run["acceptance_by_position"]) == 3
    kangaroo_recipe = (tmp_path / "work" / "kangaroo1" / "train" / "recipe.yaml").read_text()
    assert "exit_layer: 1" in kangaroo_recipe and "0.001" in kangaroo_recipe
    assert json.loads((tmp_path / "work" / "acceptance.json").read_text()) == report
    assert "| kangaroo1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown run 'medusa'"):
        suite.run_spec("medusa", recipes)
