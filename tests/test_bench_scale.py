"""tools/bench_scale.py in its tiny CPU configuration (ddp on 1 and 2 processes): the real `specdraft train`
path on a random-weight target and synthetic rows, a table and JSON. Several processes (about 30 s)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import bench_scale  # noqa: E402


def test_steady_rate_from_the_training_log(tmp_path):
    metrics = tmp_path / "metrics.csv"
    # 100 tokens a step; step s ends at 2 + 0.5 (s + 1) seconds: cumulative rate = 100 (s + 1) / elapsed
    rows = [f"{s},{100 * (s + 1) / (2 + 0.5 * (s + 1))}" for s in range(10)]
    metrics.write_text("step,train/tokens_per_s\n" + "\n".join(rows) + "\n,\n")
    assert bench_scale.steady_tokens_per_s(metrics, tokens_per_step=100, warmup=3) == pytest.approx(200.0)


@pytest.mark.slow
def test_tiny_cpu_run(tmp_path, capsys):
    report = bench_scale.main(["--config", "tiny", "--device", "cpu", "--steps", "4", "--warmup", "2",
                               "--rows", "16", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "bench_scale.json").read_text()) == report
    assert [(r["strategy"], r["gpus"]) for r in report["results"]] == [("ddp", 1), ("ddp", 2)]
    assert all(r["tokens_per_s"] > 0 for r in report["results"])
    assert report["results"][0]["efficiency"] == 1.0 and 0 < report["results"][1]["efficiency"]
    assert report["target"]["rope_scaling"]["rope_type"] == "llama3"
    assert "efficiency" in capsys.readouterr().out
