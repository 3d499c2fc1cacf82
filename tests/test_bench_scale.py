"""The scaling benchmarks in tiny CPU configurations: tools/bench_scale.py (ddp on 1 and 2 processes, the real
`specdraft train` path on a random-weight target and synthetic rows) and tools/bench_distill_scale.py (1 and 2
distill-data workers on a tiny target). Several processes each (about 30 s)."""
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


@pytest.mark.slow
def test_distill_scale_tiny_cpu(tmp_path, tiny_target_dir):
    import bench_distill_scale

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(6)))
    overrides = [f"target.path={tiny_target_dir}", f"data.prompts=[{prompts}]", "data.max_length=256",
                 "distill.max_new_tokens=4", "distill.shard_size=2", "distill.batch_size=2"]
    report = bench_distill_scale.main(["--device", "cpu", "--workers", "1,2", "--out", str(tmp_path / "out"), "--",
                                       *overrides])
    assert [r["workers"] for r in report["results"]] == [1, 2]
    first, second = report["results"]
    assert first["counts"] == second["counts"] == {"input": 6, "ok": 6, "error": 0, "skipped": 0}
    assert first["generated_tokens"] == second["generated_tokens"] > 0  # greedy: the same answers
    assert first["efficiency"] == 1.0 and second["tokens_per_s"] > 0
    assert json.loads((tmp_path / "out" / "bench_distill_scale.json").read_text()) == report
