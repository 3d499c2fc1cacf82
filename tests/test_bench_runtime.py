"""The runtime suite's parts that need no trained draft, on a tiny random target and head, CPU: `gaps` (eager: a
check that every way of timing the plain loop and the cycle runs and counts its steps, not a measurement), and
the fit of a bench run's per-prompt figures into a cost a prompt and a cost a step. The `speedup` table runs in
tests/runtime/test_cli.py, `kangaroo` in tests/runtime/test_bench_kangaroo.py."""
import json

import pytest

from tools.bench import runtime as suite


def test_gaps_time_the_loop_every_way(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    report = suite.main(["gaps", "--config", "tiny", "--shape", "3,2,6", "--tokens", "16", "--prompt-len", "12",
                         "--repeats", "1", "--max-len", "128", "--device", "cpu", "--out", str(tmp_path)])
    [row] = report["runs"]
    assert row["plain_tokens"] == 16 and 1 <= row["generate_cycles"] <= 16
    for key in ("graph", "graph+argmax", "fused", "loop", "decode_plain", "prefill_ms", "cycle"):
        assert row[key] > 0, key
    assert row["decode_plain"] * 16 > row["prefill_ms"]  # the whole call holds its prefill
    assert json.loads((tmp_path / "loop_gaps.json").read_text()) == report
    assert "| ms a step | run 1 |" in capsys.readouterr().out


def _run(prompt_ms, step_ms, cycle_ms):
    return {"per_prompt": [{"prompt_len": 10, "plain_tokens": t, "plain_s": (prompt_ms + step_ms * t) / 1000,
                            "spec_tokens": t, "spec_cycles": t // 3,
                            "spec_s": (prompt_ms + cycle_ms * (t // 3)) / 1000} for t in (30, 90, 150, 256)]}


def test_fit_recovers_prompt_and_step_costs():
    costs = suite.loop_costs(_run(25.0, 1.5, 2.4))
    assert costs["plain_prompt_ms"] == pytest.approx(25.0) and costs["plain_step_ms"] == pytest.approx(1.5)
    assert costs["spec_prompt_ms"] == pytest.approx(25.0) and costs["spec_cycle_ms"] == pytest.approx(2.4)


def test_one_step_count_puts_everything_on_the_step():
    assert suite.fit_line([5, 5], [1.0, 1.0]) == (0.0, 0.2)
