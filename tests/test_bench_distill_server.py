"""The server-engine suite, tools/bench/distill_server.py, at its smallest against the real llama.cpp server: one
A B round (the plain client and distill-data agree on every greedy answer) and one run with the server killed,
then the resume that accounts for every prompt once."""
import json

import pytest

from specdraft.testing.llama_server import missing_reason
from tools.bench import distill_server


@pytest.mark.slow
@pytest.mark.skipif(missing_reason() is not None, reason=missing_reason() or "")
def test_one_round_and_one_kill(tmp_path, capsys):
    report = distill_server.main(["--num-prompts", "4", "--max-new-tokens", "6", "--shard-size", "2", "--rounds", "1",
                                  "--kills", "1", "--concurrency", "2", "--threads", "1", "--out", str(tmp_path)])
    (only,) = report["throughput"]["rounds"]
    assert only["same_answers"] == 4 and only["plain"]["answer_tokens"] > 0 and only["distill"]["tokens_per_s"] > 0
    assert report["throughput"]["ratio"] == only["ratio"] > 0
    lost = report["nothing_lost"]
    assert lost["every_prompt_once"] and lost["final_counts"] == {"input": 4, "ok": 4, "error": 0, "skipped": 0}
    assert json.loads((tmp_path / "distill_server.json").read_text()) == report
    assert "| median |" in capsys.readouterr().out
