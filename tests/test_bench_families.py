"""The families suite, tools/bench/families.py, on the test models (--quick) on a CPU: a check that it runs, compares
the runtime with HF greedy and tables what it timed (not a measurement)."""
import json

import torch

from tools.bench import families as suite


def test_families_suite_checks_and_times_each_family(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    report = suite.main(["--quick", "--device", "cpu", "--families", "gemma3", "qwen3_moe", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "families.json").read_text()) == report
    assert [r["family"] for r in report["rows"]] == ["gemma3", "qwen3_moe"]
    for row in report["rows"]:
        assert row["identical"] == row["prompts"] == 3 and row["lossless"] and row["sliding_window"] == 8
        assert row["runtime_tokens_per_s"] > 0 and row["hf_tokens_per_s"] > 0 and not row["cuda_graphs"]
    assert [r["model_type"] for r in report["rows"]] == ["gemma3_text", "qwen3_moe"]
    out = capsys.readouterr().out
    assert "| family | model type |" in out and "| 3/3 |" in out


def test_a_changed_verifier_is_counted_as_not_identical(tmp_path, monkeypatch, one_thread):
    """The check can fail: a verifier whose final norm is off answers otherwise on every prompt."""
    from specdraft.decoding import verifier

    real = verifier.from_hf

    def broken(model, info):
        target = real(model, info)
        target.norm.data.mul_(-1.0)
        return target
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    monkeypatch.setattr(verifier, "from_hf", broken)
    report = suite.main(["--quick", "--device", "cpu", "--families", "llama", "--out", str(tmp_path)])
    assert report["rows"][0]["identical"] < 3 and not report["rows"][0]["lossless"]


def test_prompts_spread_up_to_the_longest():
    prompts = suite.random_prompts(10, 96, 4096, seed=1)
    assert len(prompts[0]) == 96 and all(1 <= len(p) <= 96 for p in prompts)
    assert all(0 < t < 4096 for p in prompts for t in p)
    assert torch.tensor([len(p) for p in prompts]).unique().numel() > 3
