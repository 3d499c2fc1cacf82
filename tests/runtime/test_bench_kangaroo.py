"""Kangaroo exports end to end on the CPU: `specdraft bench --chain --exit-threshold`, `generate --more-exits`,
and the ℓ × η sweep of the runtime suite (tools/bench/runtime.py kangaroo) over two exports (ℓ = 1, 2) of a tiny
target, with the exit chosen per cycle among both."""
import json
from pathlib import Path

import pytest

from specdraft import cli
from tools.bench import runtime


def _export(tmp, target_dir, distill_dir, exit_layer: int) -> Path:
    prompts = tmp / "eval.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"question {i}?"]}) + "\n" for i in range(2)))
    recipe = tmp / "recipe.yaml"
    recipe.write_text(f"""
target: {{path: {target_dir}}}
method: {{name: kangaroo, exit_layer: {exit_layer}, ttt_steps: 2}}
data: {{val_fraction: 0.2}}
distill: {{output_dir: {distill_dir}}}
train: {{output_dir: {tmp / 'run'}, max_steps: 2, micro_batch_size: 4, val_every_steps: 2, lr: 3.0e-3,
         warmup_steps: 1, log_every_steps: 1}}
eval: {{prompts: {prompts}, max_new_tokens: 8, depth: 3}}
""")
    assert cli.main(["train", str(recipe)]) == 0
    assert cli.main(["export", str(tmp / "run"), "--format", "hf", "--out", str(tmp / "hf")]) == 0
    return tmp / "hf"


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_target_dir, distilled):
    return [_export(tmp_path_factory.mktemp(f"kangaroo{layer}"), tiny_target_dir, distilled, layer)
            for layer in (1, 2)]


def test_bench_runs_a_chain_with_the_confidence_exit(exports, tmp_path):
    prompts = exports[0].parent / "eval.jsonl"
    assert cli.main(["bench", str(exports[0]), "--prompts", str(prompts), "--max-new-tokens", "10", "--device",
                     "cpu", "--max-len", "256", "--chain", "--depth", "3", "--exit-threshold", "0.2",
                     "--dynamic-exit", "--temperature", "0", "--no-hf", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["lossless_float32"] is True
    assert report["settings"]["chain"] == {"exit_threshold": 0.2, "dynamic_exit": True, "verify_start_layer": 1,
                                           "exit_layers": None}
    assert 0 <= report["runs"][0]["drafted_per_cycle"] <= 3


def test_generate_chooses_among_exports_at_several_exit_layers(exports, capsys):
    assert cli.main(["generate", str(exports[1]), "--prompt", "question 1?", "--max-new-tokens", "12", "--device",
                     "cpu", "--max-len", "256", "--chain", "--depth", "3", "--dynamic-exit", "--more-exits",
                     str(exports[0])]) == 0
    assert "tokens/s" in capsys.readouterr().err
    assert cli.main(["generate", str(exports[1]), "--prompt", "x", "--device", "cpu", "--max-len", "256",
                     "--chain", "--more-exits", str(exports[0])]) == 2
    assert "--dynamic-exit" in capsys.readouterr().err


def test_exit_threshold_on_a_tree_is_a_one_line_error(exports, capsys):
    assert cli.main(["generate", str(exports[0]), "--prompt", "x", "--device", "cpu", "--max-len", "256",
                     "--exit-threshold", "0.5"]) == 2
    assert "--chain" in capsys.readouterr().err


def test_sweep_tool_tables_every_exit_layer_and_threshold(exports, tmp_path, capsys):
    prompts = exports[0].parent / "eval.jsonl"
    report = runtime.main(["kangaroo", *map(str, exports), "--eta", "0", "0.5", "--prompts", str(prompts),
                           "--max-prompts", "1", "--max-new-tokens", "8", "--depth", "3", "--device", "cpu",
                           "--max-len", "256", "--choose-exit", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "kangaroo.json").read_text())["rows"]
    assert len(rows) == len(report["rows"])
    assert [(r["exit_layer"], r["eta"]) for r in rows] == [("1", 0.0), ("1", 0.5), ("2", 0.0), ("2", 0.5),
                                                           ("1+2", 0.0), ("1+2", 0.5)]
    assert sum(rows[-1]["cycles_by_exit_layer"].values()) == rows[-1]["cycles"]
    assert all(r["lossless"] and r["adapter_params"] > 0 and r["speedup_vs_plain"] > 0 for r in rows)
    assert "| ℓ | η | τ |" in capsys.readouterr().out
