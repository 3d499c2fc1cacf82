"""The verification-cost suite on the tiny geometry, CPU (eager: a check that it runs and tables what it timed,
not a measurement)."""
import json

import torch

from tests.tools import load_tool


def test_verify_cost_tables_a_pass_per_tree_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    suite = load_tool("bench/verify_cost")
    report = suite.main(["--config", "tiny", "--context", "16", "--nodes", "8", "1", "4", "--reference", "8",
                         "--repeats", "2", "--rounds", "1", "--device", "cpu", "--out", str(tmp_path)])
    assert [row["nodes"] for row in report["rows"]] == [1, 4, 8] and all(row["ms"] > 0 for row in report["rows"])
    assert json.loads((tmp_path / "verify_cost.json").read_text()) == report
    assert "| N (tree tokens) | ms a verify |" in capsys.readouterr().out


def test_a_random_tree_sees_its_ancestors_alone():
    suite = load_tool("bench/verify_cost")
    depths, mask = suite.random_tree(12, torch.Generator().manual_seed(0))
    assert depths[0] == 0 and (depths[1:] >= 1).all() and mask.diagonal().all()
    assert torch.equal(mask.sum(1), depths + 1) and not mask.triu(1).any()  # parents come first
