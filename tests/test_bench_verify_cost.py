"""The verification-cost suite on the tiny geometry, CPU (eager: a check that it runs and tables what it timed,
not a measurement)."""
import json

import torch

from tools.bench import verify_cost as suite


def test_verify_cost_tables_a_pass_per_tree_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    report = suite.main(["--config", "tiny", "--context", "16", "--nodes", "8", "1", "4", "--reference", "8",
                         "--repeats", "2", "--rounds", "1", "--device", "cpu", "--out", str(tmp_path)])
    assert [row["nodes"] for row in report["rows"]] == [1, 4, 8] and all(row["ms"] > 0 for row in report["rows"])
    assert json.loads((tmp_path / "verify_cost.json").read_text()) == report
    assert "| N (tree tokens) | ms a verify |" in capsys.readouterr().out


def test_several_geometries_print_their_curves_side_by_side(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    report = suite.main(["--config", "tiny", "tiny-qwen2", "--context", "8", "--nodes", "1", "3", "--reference", "3",
                         "--repeats", "1", "--rounds", "1", "--device", "cpu", "--out", str(tmp_path)])
    assert [curve["config"] for curve in report["configs"]] == ["tiny", "tiny-qwen2"]
    assert [curve["qkv_bias"] for curve in report["configs"]] == [False, True]
    for curve in report["configs"]:
        assert [row["nodes"] for row in curve["rows"]] == [1, 3] and all(row["ms"] > 0 for row in curve["rows"])
    assert json.loads((tmp_path / "verify_cost.json").read_text()) == report
    out = capsys.readouterr().out
    assert "| N (tree tokens) | tiny ms | tiny × N=1 | tiny-qwen2 ms | tiny-qwen2 × N=1 |" in out
    assert "| 1 |" in out and "\ntiny-qwen2:\n" in out
    model = suite.random_target("tiny-qwen2", 8, torch.device("cpu"), torch.float32)
    assert model.layers[0].wqkv.bias is not None and model.info.model_type == "qwen2"


def test_a_random_tree_sees_its_ancestors_alone():
    depths, mask = suite.random_tree(12, torch.Generator().manual_seed(0))
    assert depths[0] == 0 and (depths[1:] >= 1).all() and mask.diagonal().all()
    assert torch.equal(mask.sum(1), depths + 1) and not mask.triu(1).any()  # parents come first


def test_the_matmul_breakdown_times_each_split_that_divides_the_inner_dimension(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    report = suite.main(["--config", "tiny", "--context", "8", "--nodes", "4", "1", "--repeats", "1", "--rounds", "1",
                         "--device", "cpu", "--dtype", "float32", "--matmuls", "--split-k", "2", "3",
                         "--out", str(tmp_path)])
    assert report["dtype"] == "float32"
    for row in report["rows"]:  # the tiny geometry's K (64, 128) divide into 2 chunks, not into 3
        assert row["matmuls_ms"] > 0 and row["split_k_ms"]["2"] > 0 and row["split_k_ms"]["3"] is None
    header = "| N (tree tokens) | ms a verify | matmuls alone (ms) | matmul TFLOP/s | split K in 2 (ms) |"
    assert header in capsys.readouterr().out


def test_a_split_k_product_is_the_product():
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(5, 24, generator=generator), torch.randn(7, 24, generator=generator)
    for splits in (1, 2, 3, 8):
        torch.testing.assert_close(suite.split_k_linear(x, weight, splits), x @ weight.T)


def test_the_breakdown_holds_every_matmul_of_a_verify_pass(monkeypatch):
    """Each weight a verify pass multiplies by, once: the matmuls alone are the pass's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Weights(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("mm", "addmm"):
                self.shapes.append(tuple(args[-1].shape))  # [K, O]: the weight, transposed
            return func(*args, **(kwargs or {}))

    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    model = suite.random_target("tiny", 32, torch.device("cpu"), torch.float32)
    depths, mask = suite.random_tree(6, torch.Generator().manual_seed(0))
    prefix_len = torch.full((1,), 8, dtype=torch.long)
    with torch.no_grad(), Weights() as seen:
        hidden, _ = model.run_layers(model.embed(torch.arange(6)), prefix_len + depths, prefix_len, mask)
        model.logits(hidden)
    assert seen.shapes == [tuple(w.T.shape) for w in suite.pass_weights(model)]
