"""tools/trace_decoding.py on a tiny random target and head, CPU: both modes traced, steps and wall time per step
(the device's kernel columns are empty without a GPU)."""
import json

import torch

from specdraft.decoding.tree import TreeShape
from tools import count_cycle_launches, trace_decoding as tool


def test_both_modes_are_traced_step_by_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    engine = count_cycle_launches.build_engine("tiny", TreeShape(depth=3, topk=2, budget=6))
    prompt = torch.randint(0, 320, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = [tool.trace_mode(engine, mode, prompt, 16, tmp_path / f"{mode}.json") for mode in ("plain", "spec")]
    plain, spec = rows
    assert plain["steps"] == plain["new_tokens"] == 16
    assert spec["new_tokens"] == 16 and 1 <= spec["steps"] <= 16  # cycles: each emits one token or more
    for row in rows:
        assert row["wall_ms"] > 0 and row["wall_ms_per_step"] == row["wall_ms"] / row["steps"]
        assert row["kernel_ms"] is None and row["device_busy"] is None  # no device kernels on a CPU
        assert json.loads((tmp_path / f"{row['mode']}.json").read_text())["traceEvents"]
    assert "wall ms/step" in tool.table(rows)
