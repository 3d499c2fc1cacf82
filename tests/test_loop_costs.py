"""tools/loop_costs.py: the per-prompt fit recovers a known cost a prompt and a cost a step."""
import json

import pytest

from tests.tools import load_tool


def _report(prompt_ms, step_ms, cycle_ms):
    rows = [{"prompt_len": 10, "plain_tokens": t, "plain_s": (prompt_ms + step_ms * t) / 1000,
             "spec_tokens": t, "spec_cycles": t // 3, "spec_s": (prompt_ms + cycle_ms * (t // 3)) / 1000}
            for t in (30, 90, 150, 256)]
    return {"runs": [{"temperature": 0.0, "tau": 3.0, "speedup_vs_plain": 1.5, "per_prompt": rows}],
            "cycle_profile": {"plain_step_ms": 0.95, "cycle_ms": 2.0}}


def test_fit_recovers_prompt_and_step_costs(tmp_path, capsys):
    tool = load_tool("loop_costs")
    (tmp_path / "bench.json").write_text(json.dumps(_report(25.0, 1.5, 2.4)))
    [(name, costs)] = tool.main([f"run={tmp_path / 'bench.json'}", "--out", str(tmp_path)])
    assert name == "run"
    assert costs["plain_prompt_ms"] == pytest.approx(25.0) and costs["plain_step_ms"] == pytest.approx(1.5)
    assert costs["spec_prompt_ms"] == pytest.approx(25.0) and costs["spec_cycle_ms"] == pytest.approx(2.4)
    assert costs["plain_graph_ms"] == 0.95 and "| run | 4 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "loop_costs.json").read_text())["run"]["prompts"] == 4


def test_one_step_count_puts_everything_on_the_step():
    assert load_tool("loop_costs").fit_line([5, 5], [1.0, 1.0]) == (0.0, 0.2)
