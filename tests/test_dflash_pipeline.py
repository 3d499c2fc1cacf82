"""DFlash end to end on a tiny random target, as a user runs it: `distill-data` -> `train` -> `export` (both
layouts) -> `bench`; the bench runs the export through the block cycle, lossless in float32 at T=0 against plain
decoding, and samples at T=1. CPU."""
import json

import pytest

from specdraft import cli
from specdraft.decoding.cycles.block import BlockCycle


def _recipe(tmp_path, target_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [f"question {i} about {i * 7}?"]}) + "\n" for i in range(16)))
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""
target: {{path: {target_dir}}}
method: {{name: dflash, block_size: 4, num_layers: 1, gamma: 4.0, num_anchors: 8}}
data: {{prompts: [{prompts}], max_length: 256, val_fraction: 0.2}}
distill: {{output_dir: {tmp_path / 'data'}, max_new_tokens: 24, batch_size: 8, shard_size: 8}}
train: {{output_dir: {tmp_path / 'run'}, max_steps: 30, micro_batch_size: 4, lr: 3.0e-3, warmup_steps: 2,
        val_every_steps: 15, log_every_steps: 5}}
eval: {{prompts: {prompts}, max_prompts: 3, max_new_tokens: 16, depth: 3}}
""")
    return path, prompts


@pytest.mark.slow
def test_distill_train_export_bench(tmp_path, tiny_target_dir, monkeypatch, capsys):
    from specdraft.decoding import engine as engine_module

    recipe, prompts = _recipe(tmp_path, tiny_target_dir)
    assert cli.main(["distill-data", str(recipe)]) == 0
    assert cli.main(["train", str(recipe)]) == 0
    meta = json.loads((tmp_path / "run" / "best" / "meta.json").read_text())
    assert meta["metrics"]["val/tau_sim"] >= 1.0 and "val/acc@3" in meta["metrics"]
    for fmt in ("hf", "speculators"):
        assert cli.main(["export", str(tmp_path / "run"), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
    kinds = []
    original = engine_module.SpecEngine.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        kinds.append(type(self.own_kind))

    monkeypatch.setattr(engine_module.SpecEngine, "__init__", recording)
    capsys.readouterr()
    assert cli.main(["bench", str(tmp_path / "hf"), "--prompts", str(prompts), "--max-new-tokens", "12",
                     "--device", "cpu", "--max-len", "256", "--depth", "3", "--out", str(tmp_path / "bench")]) == 0
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert kinds and set(kinds) == {BlockCycle}
    assert report["lossless_float32"] is True
    assert [r["temperature"] for r in report["runs"]] == [0.0, 1.0]
    assert all(r["tau"] >= 1.0 for r in report["runs"])
    prompts_run = report["runs"][0]["prompts"]
    assert report["float32_matches_plain"] == f"{prompts_run}/{prompts_run}"
    assert report["speedup_vs_plain"] > 0
