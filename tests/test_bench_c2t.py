"""The C2T suite end to end on the tiny target and its chat-trained EAGLE-3 head, CPU, float32: each shape's traces,
training and export, the MT-bench runs over two shapes (pruned in both places, the verify sized or the budget's),
one Spec-Bench task, the float32 check and the goal's lines (a check that it runs and tables what it measured, not a
measurement)."""
import json

import pytest

from tests.distilled import CHAT_PROMPTS
from tools.bench import c2t as suite

pytestmark = pytest.mark.reference_kernels


def _prompts(path, texts):
    path.write_text("".join(json.dumps({"turns": [text]}) + "\n" for text in texts))
    return path


def test_c2t_suite_traces_trains_and_benches(tmp_path, tiny_target_dir, chat_base_export, capsys):
    spec_bench = tmp_path / "spec_bench"
    spec_bench.mkdir()
    _prompts(spec_bench / "spec_bench_qa.jsonl", ["an unseen question?"])
    report = suite.main([
        str(chat_base_export), "--target", str(tiny_target_dir),
        "--train-prompts", str(_prompts(tmp_path / "train.jsonl", CHAT_PROMPTS[:6])),
        "--mt-bench", str(_prompts(tmp_path / "mt.jsonl", CHAT_PROMPTS[6:8])), "--spec-bench", str(spec_bench),
        "--tasks", "qa", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--num-train", "6",
        "--trace-tokens", "16", "--train-steps", "12", "--prune-at", "selection", "expansion",
        "--batch-candidates", "40", "--shapes", "3,2,6", "3,3,6", "--betas", "0.3", "0.7", "--large-betas", "0.5",
        "--static-beta", "0.7", "--beta", "0.7",
        "--max-prompts", "2", "--per-task", "1",
        "--max-new-tokens", "12", "--lossless-prompts", "1", "--device", "cpu", "--dtype", "float32",
        "--max-len", "256"])
    made = report["classifiers"]
    assert [made[shape]["shape"] for shape in ("3,2,6", "3,3,6")] == ["3,2,6", "3,3,6"]  # one a shape, its own
    for classifier in made.values():
        assert classifier["counts"] == {"input": 6, "ok": 6, "error": 0, "skipped": 0}
        assert classifier["train_steps"] == 12 and classifier["batch_prompts"] >= 1
        assert 0.0 <= classifier["held_out"]["auc"] <= 1.0 and "recall" in classifier["held_out"]
    assert made["3,2,6"]["export"] != made["3,3,6"]["export"]
    rows = report["rows"]
    assert [(r["prompts"], r["shape"], r["beta"], r["prune_at"], r["prune_verify"]) for r in rows] == [
        ("MT-bench", "3,2,6", None, None, None), ("MT-bench", "3,2,6", 0.3, "selection", "kept"),
        ("MT-bench", "3,2,6", 0.7, "selection", "kept"), ("MT-bench", "3,2,6", 0.3, "expansion", "kept"),
        ("MT-bench", "3,2,6", 0.7, "expansion", "kept"), ("MT-bench", "3,2,6", 0.7, "selection", "budget"),
        ("MT-bench", "3,3,6", None, None, None), ("MT-bench", "3,3,6", 0.5, "selection", "kept"),
        ("Spec-Bench qa", "3,2,6", None, None, None), ("Spec-Bench qa", "3,2,6", 0.7, "selection", "kept")]
    assert all(r["lossless_bf16_prompts"] == r["prompt_count"] for r in rows)  # float32 here: always equal
    assert rows[0]["verified_per_cycle"] == rows[6]["verified_per_cycle"] == 6
    assert all(r["verified_per_cycle"] <= r["verify_rows_per_cycle"] <= 6 for r in rows)
    assert rows[5]["verify_rows_per_cycle"] == 6 and rows[2]["verified_per_cycle"] == rows[5]["verified_per_cycle"]
    assert report["lossless_float32"]["lossless"] and report["goal"][0].startswith("- classifier (3,2,6's trees):")
    assert any(line.startswith("- tree 3,3,6") for line in report["goal"])
    assert any(line.startswith("- Spec-Bench qa, β=0.7") for line in report["goal"])
    assert json.loads((tmp_path / "out" / "c2t.json").read_text())["rows"] == rows
    assert "| prompts | tree | β | verified/cycle | verify rows |" in capsys.readouterr().out


def test_traces_of_a_shape_are_its_budget_and_of_expansions_the_papers():
    args = suite.parse_args(["export", "--target", "t", "--train-prompts", "p", "--mt-bench", "m"])
    assert suite.trace_settings(args, "5,8,40") == ("trace_depth: 5, trace_topk: 8, trace_budget: 40, "
                                                    "negatives_per_positive: 1000, threshold: 0.014, best_by: auc")
    assert suite.trace_settings(args, None) == "trace_depth: 11, trace_topk: 10"
    assert args.betas == suite.BETAS["shape"] and args.static_beta == 0.02 and args.beta is None  # the middle one
    args = suite.parse_args(["export", "--target", "t", "--train-prompts", "p", "--mt-bench", "m", "--traces",
                             "expansion"])
    assert args.betas == suite.BETAS["expansion"] and args.static_beta == 0.5


def test_the_recipe_names_the_feature_set(tmp_path):
    from specdraft.recipes import load_recipe

    args = suite.parse_args([str(tmp_path), "--target", "t", "--train-prompts", str(tmp_path / "p.jsonl"),
                             "--mt-bench", "m", "--features", "paper"])
    method = load_recipe(suite.write_recipe(args, tmp_path / "w", "5,8,40")).method
    assert (method.features, method.trace_budget, method.best_by) == ("paper", 40, "auc")


def test_the_checks_beta_is_the_run_that_prunes_most_within_two_percent():
    args = suite.parse_args(["export", "--target", "t", "--train-prompts", "p", "--mt-bench", "m", "--shapes",
                             "5,8,40", "6,10,60", "--betas", "0.01", "0.02", "0.03", "0.04"])

    def run(beta, verified, tau, shape="5,8,40", verify="kept"):
        return {"shape": shape, "beta": beta, "prune_at": "selection", "prune_verify": verify,
                "verified_per_cycle": verified, "verified_vs_unpruned": verified / 40, "tau_vs_unpruned": tau}
    rows = [run(None, 40, 1.0), run(0.01, 40, 1.0), run(0.02, 36, 0.99), run(0.03, 30, 0.985),
            run(0.04, 20, 0.93), run(0.05, 10, 0.99, shape="6,10,60"), run(0.035, 25, 0.99, verify="budget")]
    assert suite.pruning_beta(rows, args) == 0.03
    rows = [row for row in rows if row["beta"] in (None, 0.01, 0.04)]  # none prunes within 2%
    assert suite.pruning_beta(rows, args) == 0.04
    assert suite.pruning_beta(rows[:2], args) == 0.03  # none prunes at all: the middle of --betas
