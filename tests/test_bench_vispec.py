"""The ViSpec suite, tools/bench/vispec.py, on the small VLM specdraft.vlm builds in its tiny mode (a tiny
random language model; its drawn-image prompt sets), CPU, float32: distill with and without the answer instruction,
ViSpec and EAGLE-3 trained on the same data, steps and seed, both benched against plain decoding on prompts with
the instruction; tables, JSON; on the described scenes, and (slow) on the determined ones alone."""
import json

import pytest

from specdraft.vlm.build import build_small_vlm
from tools.bench import vispec as suite


@pytest.mark.parametrize("tasks", ["described", pytest.param("determined", marks=pytest.mark.slow)])
def test_the_suite_regenerates_trains_both_drafts_and_benches_them(tmp_path, tiny_target_dir, capsys, monkeypatch,
                                                                    tasks):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    vlm = tmp_path / "vlm"
    build_small_vlm(vlm, target=str(tiny_target_dir), device="cpu", tiny=True, save_dtype="float32",
                    overrides=["determined_distill_prompts=4", "determined_test_prompts=3"])
    report = suite.main([str(vlm), "--tasks", tasks, "--out", str(tmp_path / "out"), "--distill-prompts", "4",
                         "--length-prompts", "2", "--max-new-tokens", "8", "--steps", "2", "--batch", "2",
                         "--bench-prompts", "2", "--bench-new-tokens", "8", "--lossless-prompts", "2", "--device",
                         "cpu", "--dtype", "float32", "--max-len", "320", "data.max_length=256", "distill.batch_size=4",
                         "distill.shard_size=4", "method.ttt_steps=2", "method.draft_vocab_size=256",
                         "data.val_fraction=0.25", "method.feature_layers=[1]",  # a two-layer language model
                         "--shapes", "3", "2,2,4"])
    lengths = report["lengths"]
    assert lengths["without"]["answers"] == lengths["with"]["answers"] == 2
    assert lengths["with_all_prompts"]["answers"] == 4 and lengths["instruction"].startswith("Please answer")
    assert report["distill"]["ok"] == 4
    assert set(report["runs"]) == {"vispec", "eagle3"}
    for name, run in report["runs"].items():
        assert run["method"] == name and run["train"]["steps"] == 2
        bench = run["bench"]
        assert bench["tau"] >= 1.0 and bench["lossless"] is True and bench["prompts"] == 2
        assert bench["lossless_float32"]["identical"] == 2
    recipes = {name: (tmp_path / "out" / name / "train" / "recipe.yaml").read_text() for name in ("vispec", "eagle3")}
    assert "num_queries" in recipes["vispec"] and "num_queries" not in recipes["eagle3"]
    assert all(f"output_dir: {tmp_path / 'out' / 'data'}" in text for text in recipes.values())  # the same data
    assert report["tau_ratio"] is not None
    assert set(report["by_shape"]) == {"3", "2,2,4"}
    for by in report["by_shape"].values():
        assert by["vispec"]["tau"] >= 1.0 and by["eagle3"]["lossless_float32"] is None and by["tau_ratio"] > 0
    assert report["bench_instruction"] == lengths["instruction"]  # benched as trained: the instruction appended
    assert json.loads((tmp_path / "out" / "vispec.json").read_text())["tau_ratio"] == report["tau_ratio"]
    printed = capsys.readouterr().out
    assert "| with, same prompts | 2 |" in printed and "| vispec | 2 |" in printed
    assert "τ(ViSpec) / τ(EAGLE-3)" in printed and "bench prompts: with the instruction" in printed
    prompts = vlm / "prompts" / ("determined" if tasks == "determined" else "")
    assert f"tasks: {tasks} ({prompts})" in printed
    assert all(f"- {prompts / 'distill.jsonl'}" in text for text in recipes.values())  # trained on the tasks' set
    assert "| shape | ViSpec τ |" in printed and "| 2,2,4 |" in printed


def _prompt_sets(folder):
    folder.mkdir(parents=True)
    for name in ("distill.jsonl", "test.jsonl"):
        (folder / name).write_text("")


def test_overrides_typed_after_the_shapes_stay_overrides(tmp_path):
    _prompt_sets(tmp_path / "prompts")
    args = suite._args([str(tmp_path), "--shapes", "12", "10,6,48", "data.max_length=1536"])
    assert args.shapes == ["12", "10,6,48"] and args.overrides == ["data.max_length=1536"]


def test_determined_tasks_are_the_vlm_s_determined_sets(tmp_path):
    """--tasks determined trains and benches on VLM/prompts/determined/ (or DIR/determined/ of --prompts); a VLM
    without them is a one-line error before anything runs."""
    _prompt_sets(tmp_path / "prompts")
    assert suite._args([str(tmp_path)]).prompt_dir == tmp_path / "prompts"
    with pytest.raises(SystemExit):
        suite._args([str(tmp_path), "--tasks", "determined"])
    _prompt_sets(tmp_path / "prompts" / "determined")
    args = suite._args([str(tmp_path), "--tasks", "determined"])
    assert args.tasks == "determined" and args.prompt_dir == tmp_path / "prompts" / "determined"
    other = tmp_path / "elsewhere"
    _prompt_sets(other / "determined")
    assert suite._args([str(tmp_path), "--prompts", str(other), "--tasks", "determined"]).prompt_dir == \
        other / "determined"
    recipe = suite.suite_recipe(args, tmp_path / "out", "vispec", 4)
    assert recipe.data.prompts == [str(tmp_path / "prompts" / "determined" / "distill.jsonl")]
