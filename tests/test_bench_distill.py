"""The distillation suite, tools/bench/distill.py, on a tiny target: 1 and 2 distill-data workers (several
processes), the same answers from both, and the table and JSON of both counts."""
import json

import pytest

from tools.bench import distill


@pytest.mark.slow
def test_one_and_two_workers_distill_the_same_answers(tmp_path, tiny_target_dir, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(6)))
    overrides = [f"target.path={tiny_target_dir}", f"data.prompts=[{prompts}]", "data.max_length=256",
                 "distill.max_new_tokens=4", "distill.shard_size=2", "distill.batch_size=2"]
    report = distill.main(["--device", "cpu", "--workers", "1,2", "--out", str(tmp_path / "out"), "--", *overrides])
    assert [(r["workers"], r["status"]) for r in report["results"]] == [(1, "ok"), (2, "ok")]
    first, second = report["results"]
    assert first["counts"] == second["counts"] == {"input": 6, "ok": 6, "error": 0, "skipped": 0}
    assert first["generated_tokens"] == second["generated_tokens"] > 0  # greedy: the same answers
    assert first["efficiency"] == first["efficiency_generate"] == 1.0 and second["tokens_per_s"] > 0
    assert json.loads((tmp_path / "out" / "distill.json").read_text()) == report
    assert "| 2 |" in capsys.readouterr().out


def test_engines_side_by_side(tmp_path, tiny_target_dir, monkeypatch, capsys, one_thread):
    """`engines` on the CPU: hf and static (kernel references) on the same prompts, then in float32, the same
    answers from both."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}) + "\n"
                               for i in range(5)))
    report = distill.main([
        "engines", "--prompts", str(prompts), "--device", "cpu", "--batch-size", "2", "--max-prompts", "5",
        "--identity-prompts", "3", "--out", str(tmp_path / "out"), "--", f"target.path={tiny_target_dir}",
        "distill.max_new_tokens=5"])
    runs = [(r["engine"], r["dtype"], r["prompts"]) for r in report["results"]]
    assert runs == [("hf", "auto", 5), ("static", "auto", 5), ("hf", "float32", 3), ("static", "float32", 3)]
    hf, static = report["results"][:2]
    assert hf["generated_tokens"] == static["generated_tokens"] > 0 and static["speedup_vs_hf"] > 0
    assert static["same_as_hf"] == {"identical": 5, "compared": 5, "first_difference": None}
    assert report["results"][3]["same_as_hf"]["identical"] == 3
    assert json.loads((tmp_path / "out" / "distill_engines.json").read_text()) == report
    assert "| static | float32 | 3 | 2 |" in capsys.readouterr().out
