"""The MoE suite, tools/bench/moe.py, on the tiny geometry on a CPU (eager: a check that it runs and tables what it
timed, not a measurement), and the runtime's router (which its layer part runs) against Hugging Face Qwen3-MoE's."""
import json

import pytest
import torch

from tools.bench import moe as suite


def test_moe_suite_tables_both_parts_per_row_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    report = suite.main(["--config", "tiny", "--device", "cpu", "--nodes", "4", "1", "--context", "8", "--calls",
                         "2", "--reps", "1", "--copy-mib", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "moe.json").read_text()) == report
    assert [(r["routing"], r["nodes"]) for r in report["experts"]] == [("random", 1), ("random", 4), ("skewed", 1),
                                                                       ("skewed", 4)]
    assert all(r["match"] and r["us"] > 0 and 0 < r["touched_experts"] <= 8 for r in report["experts"])
    one = next(r for r in report["experts"] if r["nodes"] == 1)
    assert one["touched_experts"] == 2 and one["mb"] == pytest.approx((2 * 3 * 64 * 48 + 2 * 64) * 4 / 1e6, abs=0.01)
    assert [(r["rows"], r["nodes"]) for r in report["layer"]] == [("random", 1), ("random", 4), ("siblings", 1),
                                                                  ("siblings", 4)]
    assert all(r["us"] > 0 and r["model_ms"] > 0 for r in report["layer"]) and report["layer"][0]["x_decode"] == 1
    assert [r["touched_experts"] for r in report["layer"] if r["nodes"] == 1] == [2, 2]  # one row: its top 2
    assert all(2 <= r["touched_experts"] <= 8 for r in report["layer"])
    assert report["sweep"] == [] and report["copy_gbps"] > 0
    out = capsys.readouterr().out
    assert "| routing | N | experts touched |" in out and "| rows | N | experts touched |" in out


def test_the_sweep_times_each_launch_config_through_the_kernel(tmp_path, monkeypatch, capsys):
    """Under the interpreter (tests set TRITON_INTERPRET=1 on a CPU), one config swept: its row per routing and N; a
    config the kernel refuses leaves its error in its rows and the sweep goes on."""
    monkeypatch.setattr(suite, "SWEEP", [(8, 16, 16, 16, 4, 2), (16, 16, 16, 16, 4, 2)])
    report = suite.main(["--config", "tiny", "--device", "cpu", "--nodes", "3", "--parts", "experts", "--sweep",
                         "--calls", "1", "--reps", "1", "--copy-mib", "1", "--out", str(tmp_path)])
    assert [(r["routing"], r["nodes"], r["config"]["block_m"], "us" in r) for r in report["sweep"]] == [
        ("random", 3, 8, False), ("random", 3, 16, True), ("skewed", 3, 8, False), ("skewed", 3, 16, True)]
    assert "powers of two" in report["sweep"][0]["error"]
    assert report["layer"] == [] and "fastest config" in capsys.readouterr().out


def test_skewed_routing_shares_a_pool_and_bytes_count_the_touched_experts():
    generator = torch.Generator().manual_seed(0)
    expert_ids, weights = suite.routing(64, 128, 8, True, generator)
    assert suite.touched_experts(expert_ids, 128) == 16
    assert all(len(set(row.tolist())) == 8 for row in expert_ids)  # distinct within a row
    torch.testing.assert_close(weights.sum(1), torch.ones(64))
    expert_ids, _ = suite.routing(64, 128, 8, False, generator)
    assert suite.touched_experts(expert_ids, 128) > 100
    geometry = suite.GEOMETRIES["qwen3-30b-a3b"]
    assert suite.expert_bytes(geometry, 8, 2) == 8 * 3 * 2048 * 768 * 2


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_route_is_hugging_face_qwen3_moes_router(norm_topk_prob):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    config = Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm_topk_prob)
    router = Qwen3MoeTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    hidden = torch.randn(5, 32)
    _, expected_weights, expected_ids = router(hidden)
    from specdraft.decoding.verifier.layer import route

    expert_ids, expert_weights = route(hidden @ router.weight.T, 4, norm_topk_prob)
    assert torch.equal(expert_ids, expected_ids)
    torch.testing.assert_close(expert_weights, expected_weights)
