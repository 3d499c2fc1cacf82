"""The families suite, tools/bench/families.py, on the test models (--quick) on a CPU: a check that it runs, compares
the runtime and distill-data's static engine with HF greedy and tables what it timed (not a measurement)."""
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


def flip_final_norm(monkeypatch, module):
    """`module.from_hf` builds a verifier whose final norm is negated: it answers otherwise on every prompt."""
    real = module.from_hf

    def broken(model, info):
        target = real(model, info)
        target.norm.data.mul_(-1.0)
        return target
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    monkeypatch.setattr(module, "from_hf", broken)


def test_a_changed_verifier_is_counted_as_not_identical(tmp_path, monkeypatch, one_thread):
    """The check can fail: a verifier whose final norm is off answers otherwise on every prompt."""
    from specdraft.decoding import verifier

    flip_final_norm(monkeypatch, verifier)
    report = suite.main(["--quick", "--device", "cpu", "--families", "llama", "--out", str(tmp_path)])
    assert report["rows"][0]["identical"] < 3 and not report["rows"][0]["lossless"]


def test_the_static_part_answers_a_batch_as_hf_generate(tmp_path, monkeypatch, capsys, one_thread):
    """The static engine and HF generate on one batch of 8 mixed-length prompts: every row identical, the rows
    checked alone too, both timed; the other parts' fields absent."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    report = suite.main(["--quick", "--device", "cpu", "--parts", "static", "--families", "mistral", "qwen2_moe",
                         "--out", str(tmp_path)])
    assert json.loads((tmp_path / "families.json").read_text()) == report
    assert report["parts"] == ["static"] and report["batch"] == 8
    for row in report["rows"]:
        assert row["static_identical"] == row["static_batch"] == 8
        assert row["static_single_identical"] == row["static_single_rows"] == 3
        assert row["static_tokens_per_s"] > 0 and row["hf_batch_tokens_per_s"] > 0 and row["static_x_hf"] > 0
        assert not row["static_cuda_graphs"] and "identical" not in row and "x_hf" not in row
    out = capsys.readouterr().out
    assert "| static == HF batch | static == HF alone |" in out and "| 8/8 | 3/3 |" in out
    assert "runtime tokens/s" not in out


def test_a_changed_static_engine_is_counted_as_not_identical(tmp_path, monkeypatch, one_thread):
    """The static check can fail: the static engine over a verifier whose final norm is off."""
    from specdraft.decoding import batched

    flip_final_norm(monkeypatch, batched)
    report = suite.main(["--quick", "--device", "cpu", "--parts", "static", "--families", "llama", "--out",
                         str(tmp_path)])
    row = report["rows"][0]
    assert row["static_identical"] < 8 and row["static_single_identical"] < 3


def test_rows_checked_alone_spread_from_the_shortest_prompt_to_the_longest():
    prompts = [[1] * n for n in (5, 1, 9, 3, 7)]
    assert suite.spread_rows(prompts, 3) == [1, 0, 2]  # lengths 1, 5 and 9
    assert suite.spread_rows(prompts, 1) == [1] and suite.spread_rows(prompts, 9) == [1, 3, 0, 4, 2]


def test_prompts_spread_up_to_the_longest():
    prompts = suite.random_prompts(10, 96, 4096, seed=1)
    assert len(prompts[0]) == 96 and all(1 <= len(p) <= 96 for p in prompts)
    assert all(0 < t < 4096 for p in prompts for t in p)
    assert torch.tensor([len(p) for p in prompts]).unique().numel() > 3
