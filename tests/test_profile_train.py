"""tools/profile_train.py on a tiny random target, CPU: the recipe's own run, a few steps profiled."""
import json

from tests.test_train_export_eval import make_recipe
from tools import profile_train


def test_profile_train_reports_steps_and_ops(tmp_path, tiny_target_dir, distilled, capsys):
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled)
    report = profile_train.main([str(recipe), "--warmup", "2", "--steps", "3", "--top", "5",
                                 "--out", str(tmp_path / "prof")])
    assert report["steps"] == 3 and report["train_summary"]["steps"] == 5
    assert report["step_ms"] > 0 and len(report["top_host"]) == 5
    assert report["device_busy_ms"] == 0 and report["kernel_launches_per_step"] == 0  # no GPU: no kernels
    assert any(op["name"].startswith("aten::") for op in report["top_host"])
    saved = json.loads((tmp_path / "prof" / "profile_train.json").read_text())
    assert saved["step_ms"] == report["step_ms"]
    assert "most host time" in capsys.readouterr().out


def test_split_forward_times_the_target_and_the_draft_apart(tmp_path, tiny_target_dir, distilled, capsys):
    """--phases --split-forward: the forward as `target` (the frozen target's features) and `draft`, each step's
    four phases summing to its time; the module's features still work through the wrapper (validation off)."""
    recipe = make_recipe(tmp_path, tiny_target_dir, distilled)
    report = profile_train.main([str(recipe), "--warmup", "1", "--steps", "2", "--phases",
                                 "--split-forward", "--out", str(tmp_path / "prof")])
    phases = report["phase_ms_each"]
    assert list(phases) == ["target", "draft", "backward", "step"]
    assert all(len(values) == 2 and min(values) > 0 for values in phases.values())
    for index, step_ms in enumerate(report["step_ms_each"]):
        assert abs(sum(values[index] for values in phases.values()) - step_ms) < 1e-6
    assert "  target:" in capsys.readouterr().out


def test_host_waits_counts_synchronizations_and_copies_to_the_host():
    """The events in which the host waits for the device (a `.item()` shows as a device-to-host copy), per
    step; every other event is left out."""
    from types import SimpleNamespace

    from specdraft.train.profiling import host_waits

    events = [SimpleNamespace(key="cudaStreamSynchronize", count=4), SimpleNamespace(key="Memcpy DtoH (Device -> "
              "Pageable)", count=2), SimpleNamespace(key="Memcpy HtoD (Pageable -> Device)", count=6),
              SimpleNamespace(key="aten::mm", count=340), SimpleNamespace(key="cudaMemcpyAsync", count=8)]
    assert host_waits(events, steps=2) == {"cudaStreamSynchronize": 2.0, "Memcpy DtoH (Device -> Pageable)": 1.0}
