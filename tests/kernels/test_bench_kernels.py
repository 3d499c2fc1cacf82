"""The kernels suite, tools/bench/kernels.py, in its tiny CPU configuration (the Triton interpreter): every op is
timed against its reference, the outputs match, and the JSON holds one row per (op, shape)."""
import json

from tools.bench import kernels as bench


def test_bench_kernels_cpu(tmp_path, capsys):
    result = bench.main(["--device", "cpu", "--out", str(tmp_path / "kernels.json")])
    assert json.loads((tmp_path / "kernels.json").read_text()) == result
    assert result["all_match"] and all(row["match"] for row in result["rows"])
    ops = {row["op"] for row in result["rows"]}
    assert ops == {"draft_topk", "draft_topk vs torch.topk", "verify_greedy", "compact_kv", "tree_attention",
                   "rms_norm", "add_rms_norm", "rope_cache", "silu_mul", "draft_input", "advance_frontier",
                   "select_tree", "commit_path", "top_entropy", "prune_children", "grouped_experts"}
    assert all(row["bitwise"] for row in result["rows"]
               if row["op"] in {"rms_norm", "add_rms_norm", "rope_cache", "draft_input"})
    assert all(row["reference_us"] > 0 and row["triton_us"] > 0 for row in result["rows"])
    assert "| op | shape | reference µs | Triton µs |" in capsys.readouterr().out
