"""tools/plain_loop_gaps.py on a tiny random target and head, CPU (eager: a check that every way of timing the
plain loop runs and counts its steps, not a measurement)."""
from types import SimpleNamespace

import pytest
import torch

from tests.tools import load_tool


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    tool = load_tool("plain_loop_gaps")
    engine = tool.build_engine("tiny", "3,2,6", torch.device("cpu"), max_len=128)
    prompt = torch.randint(0, 320, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    return tool, engine, prompt


def test_random_target_loop_is_timed_every_way(tiny):
    tool, engine, prompt = tiny
    row = tool.measure(engine, prompt, 16)
    assert row["plain_tokens"] == 16 and 1 <= row["generate_cycles"] <= 16
    for key in ("graph", "graph+argmax", "fused", "loop", "decode_plain", "prefill_ms", "cycle"):
        assert row[key] > 0, key
    assert row["decode_plain"] * 16 > row["prefill_ms"]  # the whole call holds its prefill


def test_real_mode_times_bench_order_and_each_prompt(tiny):
    tool, engine, prompt = tiny
    runtime = SimpleNamespace(engine=engine, eos_ids=[])
    row = tool.measure_real(runtime, [prompt, prompt[:7]], 8)
    for order in ("interleaved_gc_on", "interleaved_gc_off", "spec_first_gc_on", "blocked_gc_on"):
        assert row[f"plain_{order}"] > 0 and row[f"cycle_{order}"] > 0
    assert [p["prompt_len"] for p in row["per_prompt"]] == [12, 7]
    assert all(p["plain_tokens"] == 8 and 1 <= p["cycles"] <= 8 for p in row["per_prompt"])


def test_first_seen_times_each_new_length_twice(tiny, capsys):
    tool, engine, prompt = tiny
    runtime = SimpleNamespace(engine=engine, eos_ids=[])
    rows = tool.first_seen(runtime, [prompt, prompt[:7], prompt[:12], prompt[:5]])["first_seen"]
    assert [row["prompt_len"] for row in rows] == [7, 5]  # the warm-up's length (12) is not new
    assert all(row["prefill_first_ms"] > 0 and row["prefill_again_ms"] > 0 for row in rows)
    assert "cumulative" in capsys.readouterr().out  # the first pass's profile
