"""distill-data (Hugging Face generate) -> train (EAGLE-3, a few steps) -> export (hf and speculators) for a tiny
random target of every family (tests.family_targets), on the CPU: each export names the target's Hugging Face class
and model type, writes the draft layer the serving engines build (SGLang's LlamaForCausalLMEagle3, vLLM's
Eagle3LlamaForCausalLM from transformer_layer_config.model_type "llama") and the aux layer ids each counts, and
loads back (specdraft.drafts) with the run's weights. Each stage is one function, so that eval and bench join as one
line each once the runtime runs the family."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdraft import cli
from specdraft.drafts import load_draft
from tests.family_targets import ARCHITECTURES, FAMILY_CONFIGS, save_family_target

FAMILIES = list(FAMILY_CONFIGS)
LAYERS = 4  # EAGLE-3's default feature layers (2, L // 2, L - 3) = (2, 2, 1)
FEATURE_LAYERS = [2, 2, 1]
MODEL_TYPES = {"gemma3": "gemma3_text"}  # a family's model_type where it is not the family's name
VLLM_EAGLE3_LAYERS = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}
"""vLLM 0.33's speculators loader: transformer_layer_config.model_type -> the draft class it builds (others refused)."""


PROMPTS = 8


def write_recipe(work: Path, target: Path) -> Path:
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}?"}) + "\n" for i in range(PROMPTS)))
    path = work / "recipe.yaml"
    path.write_text(f"""
target: {{path: {target}}}
method: {{name: eagle3, ttt_steps: 2, draft_vocab_size: 256}}
data: {{prompts: [{prompts}], val_fraction: 0.25}}
distill: {{output_dir: {work / 'data'}, engine: hf, max_new_tokens: 24, batch_size: 4, shard_size: 4}}
train: {{output_dir: {work / 'run'}, max_steps: 4, micro_batch_size: 2, val_every_steps: 4, lr: 3.0e-3,
         warmup_steps: 1, log_every_steps: 2}}
""")
    return path


def distill(recipe: Path) -> None:
    assert cli.main(["distill-data", str(recipe)]) == 0
    counts = json.loads((recipe.parent / "data" / "counts.json").read_text())
    assert counts["ok"] == PROMPTS and counts["error"] == 0, counts


def train(recipe: Path) -> None:
    assert cli.main(["train", str(recipe)]) == 0
    assert json.loads((recipe.parent / "run" / "train_summary.json").read_text())["steps"] == 4


def export(run: Path, fmt: str, out: Path) -> dict:
    """The run exported as `fmt` into `out` (float32) -> its config.json."""
    assert cli.main(["export", str(run), "--format", fmt, "--out", str(out), "--dtype", "float32",
                     "--verifier", "org/tiny"]) == 0
    return json.loads((out / "config.json").read_text())


def check_hf(config: dict, family: str) -> None:
    """SGLang's EAGLE-3 draft config: its draft class, the target's vocabulary and width, the aux layers counted by
    the layer that outputs them; the target's class and model type in specdraft's section."""
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["vocab_size"], config["draft_vocab_size"]) == (64, 320, 256)
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in FEATURE_LAYERS],
                                      "use_aux_hidden_state": True}
    target = config["specdraft"]["target_info"]
    assert target["architectures"] == [ARCHITECTURES[family]]
    assert target["model_type"] == MODEL_TYPES.get(family, family)


def check_speculators(config: dict, family: str) -> None:
    """speculators' Eagle3SpeculatorConfig as vLLM reads it: the verifier by hub id and HF class, a Llama draft
    layer (the class vLLM builds), the target's width, aux layers counted as inputs of the target's layers."""
    assert config["architectures"] == ["Eagle3Speculator"] and config["speculators_model_type"] == "eagle3"
    verifier = config["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "org/tiny", "architectures": [ARCHITECTURES[family]]}
    layer = config["transformer_layer_config"]
    assert VLLM_EAGLE3_LAYERS[layer["model_type"]] == "Eagle3LlamaForCausalLM"
    assert (layer["hidden_size"], layer["vocab_size"], layer["num_hidden_layers"]) == (64, 320, 1)
    assert config["target_hidden_size"] == 64 and config["draft_vocab_size"] == 256
    assert config["eagle_aux_hidden_state_layer_ids"] == FEATURE_LAYERS
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 2


def check_loads_back(export_dir: Path, run: Path, family: str) -> None:
    """The export loads as the run's draft (same weights), for the target it names."""
    loaded = load_draft(export_dir)
    assert loaded.spec.name == "eagle3" and list(loaded.draft.feature_layers) == FEATURE_LAYERS
    assert loaded.target.architectures == (ARCHITECTURES[family],)
    trained = load_file(run / "best" / "draft.safetensors")
    for name, tensor in loaded.draft.state_dict().items():
        torch.testing.assert_close(tensor, trained[name].to(tensor.dtype), rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_distills_trains_and_exports(tmp_path, family, one_thread):
    target = save_family_target(tmp_path / "target", family, layers=LAYERS)
    recipe = write_recipe(tmp_path, target)
    distill(recipe)
    train(recipe)
    run = tmp_path / "run"
    check_hf(export(run, "hf", tmp_path / "hf"), family)
    check_speculators(export(run, "speculators", tmp_path / "speculators"), family)
    for fmt in ("hf", "speculators"):
        check_loads_back(tmp_path / fmt, run, family)


@pytest.mark.parametrize("model_type, expected", [("gemma3_text", ["Gemma3ForCausalLM"]),
                                                  ("qwen3_moe", ["Qwen3MoeForCausalLM"]),
                                                  ("mixtral", ["MixtralForCausalLM"]), ("no_such_family", [])])
def test_a_target_config_without_architectures_names_the_class_of_its_model_type(model_type, expected):
    """verifier.architectures for a target whose config names no class (or an export written before TargetInfo
    kept them): the causal-LM class transformers maps its model_type to."""
    from specdraft.core.types import TargetInfo
    from specdraft.targets.provenance import hf_architectures

    geometry = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                    vocab_size=320, rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=1024)
    assert hf_architectures(TargetInfo(name_or_path="t", model_type=model_type, **geometry)) == expected
    named = TargetInfo(name_or_path="t", model_type=model_type, architectures=("X",), **geometry)
    assert hf_architectures(named) == ["X"]
