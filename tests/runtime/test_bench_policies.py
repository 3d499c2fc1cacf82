"""`specdraft bench --categories` and the drafting-policy suite (tools/bench/policies.py) on a tiny export, CPU:
every variant on every category of a Spec-Bench-shaped file, against plain decoding, float32-checked; variants
parse into runtime settings; a policy parameter out of range is a one-line error at the command line."""
import json

import pytest

from specdraft import cli
from specdraft.core.errors import SpecdraftError
from specdraft.runtime.categories import category_prompts, parse_variant
from tests.runtime.test_cli import export_dir  # noqa: F401 (the fixture: a tiny trained export)
from tools.bench import policies as suite

QUESTIONS = [("writing", "Write a poem."), ("coding", "Write code."), ("translation", "Translate: hallo welt"),
             ("summarization", "Summarize: the cat sat on the mat. The cat sat on the mat."), ("qa", "Who?"),
             ("math_reasoning", "2 + 2?"), ("rag", "Context: a b c a b c. Question: what follows a b?")]


@pytest.fixture
def spec_bench(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n"
                            for i, (c, t) in enumerate(QUESTIONS)))
    return path


def test_categories_group_mt_bench_and_keep_spec_benchs_order(spec_bench):
    grouped = category_prompts(str(spec_bench), None)
    assert list(grouped) == ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert grouped["mt_bench"] == ["Write a poem.", "Write code."]
    assert category_prompts(str(spec_bench), 1)["mt_bench"] == ["Write a poem."]


def test_variants_parse_into_typed_runtime_settings():
    assert parse_variant("ddd,depth=7,ddd_threshold=0.3") == {"policy": "ddd", "depth": 7, "ddd_threshold": 0.3}
    assert parse_variant("sam,sam_merge=true") == {"policy": "sam", "sam_merge": True}
    with pytest.raises(SpecdraftError, match="not FIELD=VALUE of a runtime field"):
        parse_variant("sam,colour=red")
    with pytest.raises(SpecdraftError, match="depth takes a int"):
        parse_variant("ddd,depth=deep")


def test_bench_categories_runs_every_variant_on_every_category(export_dir, spec_bench, tmp_path, capsys):  # noqa: F811
    assert cli.main(["bench", str(export_dir), "--categories", "--prompts", str(spec_bench), "--policies", "fixed",
                     "sam,sam_min_match=1", "ddd", "--max-new-tokens", "8", "--device", "cpu", "--max-len", "256",
                     "--depth", "3", "--topk", "2", "--budget", "6", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_categories.json").read_text())
    assert len(report["rows"]) == 6 * 3 and report["variants"] == ["fixed", "sam,sam_min_match=1", "ddd"]
    for row in report["rows"]:
        assert row["same_as_plain"] == row["prompts"] and row["float32_identical"] == row["float32_prompts"]
        assert row["speedup_vs_plain"] > 0 and row["tau"] >= 1
    assert "| 0 | rag | ddd |" in capsys.readouterr().err


def test_a_policy_parameter_out_of_range_is_a_one_line_error(export_dir, capsys):  # noqa: F811
    assert cli.main(["generate", str(export_dir), "--prompt", "x", "--device", "cpu", "--policy", "svip",
                     "--svip-threshold", "1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "specdraft: error: runtime.svip_threshold must be in (0, 1), got 1.5"


def test_the_suite_prints_each_variant_against_the_fixed_tree(export_dir, spec_bench, tmp_path, capsys):  # noqa: F811
    report = suite.main(["categories", str(export_dir), "--prompts", str(spec_bench), "--per-category", "1",
                         "--max-new-tokens", "6", "--device", "cpu", "--max-len", "256", "--lossless-prompts", "1",
                         "--variants", "fixed", "svip,svip_threshold=0.1", "--out", str(tmp_path)])
    rows = report["categories"]["rows"]
    assert {row["variant"] for row in rows} == {"fixed", "svip,svip_threshold=0.1"}
    assert all(row["float32_identical"] == 1 for row in rows)
    out = capsys.readouterr().out
    assert "svip,svip_threshold=0.1 / fixed" in out and "| mean |" in out
    assert json.loads((tmp_path / "policies.json").read_text())["categories"]["variants"][0] == "fixed"


def _rates_report(rates, categories=("mt_bench", "summarization", "rag"), identical=10):
    """A categories report with these tokens/s ({variant: rate, or {category: rate}})."""
    rows = [{"category": c, "variant": v, "tokens_per_s": r if isinstance(r, (int, float)) else r[c],
             "float32_identical": identical, "float32_prompts": 10} for c in categories for v, r in rates.items()]
    return {"variants": list(rates), "rows": rows, "errors": []}


def test_the_goal_lines_judge_the_issues_targets():
    report = _rates_report({"fixed": 100.0, "sam": {"mt_bench": 97.0, "summarization": 120.0, "rag": 116.0},
                            "svip": 104.0, "ddd,depth=7": {"mt_bench": 110.0, "summarization": 104.0, "rag": 104.0}})
    table = suite.category_goals(report)
    for line in ("| sam | × fixed on summarization | 1.200 | ≥ 1.15 | met |",
                 "| sam | × fixed on rag | 1.160 | ≥ 1.15 | met |",
                 "| sam | × fixed, lowest other category | 0.970 | ≥ 0.98 | missed |",
                 "| svip | × fixed, mean of the categories | 1.040 | ≥ 1.05 | missed |",
                 "| ddd,depth=7 | × fixed, mean of the categories | 1.060 | ≥ 1.05 | met |",
                 "| every variant | float32 identical to plain | 120/120 | all | met |"):
        assert line in table
    assert "float32 identical to plain | 108/120 | all | missed |" in suite.category_goals(
        _rates_report({"fixed": 1.0, "sam": 1.0, "svip": 1.0, "ddd": 1.0}, identical=9))
    sampling = {"variants": suite.SAMPLING_VARIANTS, "rows": [
        {"variant": v, "category": "mt_bench", "speedup_vs_plain": s}
        for v, s in zip(suite.SAMPLING_VARIANTS, (1.6, 1.4, 1.2, 0.95, 0.8))]}
    sampling["rows"] += [{"variant": "fixed", "category": "translation", "speedup_vs_plain": 1.1}]  # not a goal's
    assert suite.sampling_goals(sampling).splitlines()[2:] == [
        "| fixed | × plain at T=1 | 1.600 | ≥ 1.5 | met |",
        "| fixed,depth=5,topk=8,budget=40 | × plain at T=1 | 1.400 | ≥ 1 | met |",
        "| fixed,chain=true,depth=6 | × plain at T=1 | 0.950 | ≥ 1 | missed |"]  # point-mass drafts: no goal
