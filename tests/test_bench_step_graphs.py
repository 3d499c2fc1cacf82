"""The step-graphs suite, tools/bench/step_graphs.py, in its tiny CPU configuration: every row runs (the graph rows
through StepGraphs' CPU stand-in), the table has the ratio to plain, launch counts and the replay check. CPU."""
import json

import pytest

from tools.bench import step_graphs as bench


def test_tiny_cpu_run_writes_every_row(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--config", "tiny", "--device", "cpu", "--seq-lens", "32", "--batch", "2", "--warmup", "3",
                "--steps", "1", "--profile", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [r["row"] for r in report["rows"]] == list(bench.SETTINGS)
    for row in report["rows"]:
        assert row["status"] == "ok", row
        assert row["steps_per_s"] > 0 and row["tokens_per_s"] == pytest.approx(row["steps_per_s"] * 64)
        assert row["vs_plain"] > 0 and "launch_calls_per_step" in row and row["kernels_per_step"] == 0
        assert not row["compiled"] and row["optimizer"] == "adamw"  # compile and the fused AdamW: CUDA only
    graphs = [r for r in report["rows"] if r["graphs"]]
    assert len(graphs) == 3 and all(r["captured_graphs"] == 1 for r in graphs)
    assert all(r["loss_rel_delta"] < 1e-5 and r["grad_rel_delta"] < 1e-4 for r in graphs)
    printed = capsys.readouterr().out
    assert "| plain | 32 | ok |" in printed and "1.00x" in printed
    assert "goal (a graph row >= 2x plain's steps/s)" in printed


def test_a_failing_row_is_reported_and_the_others_run(tmp_path, monkeypatch):
    def broken(self, batch):
        raise RuntimeError("no kernel image is available\nmore")

    monkeypatch.setattr(bench.Step, "eager_loss", broken)
    report = bench.main(["--config", "tiny", "--device", "cpu", "--seq-lens", "16", "--batch", "1", "--rows",
                         "plain", "graphs", "--warmup", "3", "--steps", "1", "--profile", "0",
                         "--out", str(tmp_path / "b.json")])
    assert [r["status"] for r in report["rows"]] == ["error: RuntimeError: no kernel image is available"] * 2


def test_graph_rows_need_a_warmup_that_reaches_the_capture(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--config", "tiny", "--device", "cpu", "--warmup", "2", "--out", str(tmp_path)])


@pytest.mark.slow
def test_cli_part_times_specdraft_train_and_reports_a_graph_row_that_cannot_run(tmp_path, capsys):
    """`specdraft train` on the CPU: defaults runs and is timed; train.cuda_graphs=true is the row's one-line error."""
    report = bench.cli_main(["--config", "tiny", "--device", "cpu", "--recipe", "recipes/smoke/eagle3_smollm2.yaml",
                             "--seq-len", "64", "--batch", "2", "--rows", "defaults", "graphs", "--warmup", "5",
                             "--steps", "5", "--out", str(tmp_path)])
    defaults, graphs = report["rows"]
    assert defaults["status"] == "ok" and defaults["steps_per_s"] > 0 and defaults["vs_defaults"] == 1.0
    assert graphs["status"].startswith("error: exit 2") and "train.cuda_graphs=true needs a CUDA device" in \
        graphs["status"]
    assert "| defaults | ok |" in capsys.readouterr().out
