"""The distillation suite, tools/bench/distill.py, on a tiny target: 1 and 2 distill-data workers (several
processes), the same answers from both, and the table and JSON of both counts."""
import json

import pytest

from tests.tools import load_tool


@pytest.mark.slow
def test_one_and_two_workers_distill_the_same_answers(tmp_path, tiny_target_dir, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(6)))
    overrides = [f"target.path={tiny_target_dir}", f"data.prompts=[{prompts}]", "data.max_length=256",
                 "distill.max_new_tokens=4", "distill.shard_size=2", "distill.batch_size=2"]
    report = load_tool("bench/distill").main(["--device", "cpu", "--workers", "1,2", "--out", str(tmp_path / "out"),
                                              "--", *overrides])
    assert [(r["workers"], r["status"]) for r in report["results"]] == [(1, "ok"), (2, "ok")]
    first, second = report["results"]
    assert first["counts"] == second["counts"] == {"input": 6, "ok": 6, "error": 0, "skipped": 0}
    assert first["generated_tokens"] == second["generated_tokens"] > 0  # greedy: the same answers
    assert first["efficiency"] == first["efficiency_generate"] == 1.0 and second["tokens_per_s"] > 0
    assert json.loads((tmp_path / "out" / "distill.json").read_text()) == report
    assert "| 2 |" in capsys.readouterr().out
