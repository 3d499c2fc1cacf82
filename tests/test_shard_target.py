"""train.shard_target resolved (specdraft.train.trainer.shard_target) and the weight estimate `auto` uses. CPU,
instant; the sharded run itself is tests/test_multi_gpu.py (2 GPUs)."""
import pytest
import torch

from specdraft.config import load_recipe
from specdraft.methods.base import TargetInfo
from specdraft.target.load import estimated_weight_bytes
from specdraft.train.trainer import shard_target
from tests.tiny import tiny_llama_config


@pytest.fixture
def recipe_path(tmp_path, tiny_target_dir):
    path = tmp_path / "recipe.yaml"
    path.write_text(f"method: {{name: eagle3}}\ntarget: {{path: {tiny_target_dir}}}\n")
    return path


@pytest.mark.parametrize("overrides, expected", [
    ([], False),  # auto, strategy auto: replicated
    (["train.strategy=deepspeed_stage_3"], False),  # auto on the CPU: nothing to shard across
    (["train.strategy=deepspeed_stage_3", "train.shard_target=false"], False),
    (["train.strategy=deepspeed_stage_3", "train.shard_target=true"], True),
])
def test_shard_target_resolution(recipe_path, overrides, expected):
    assert shard_target(load_recipe(recipe_path, overrides), torch.device("cpu")) is expected


def test_weight_estimate_matches_the_model():
    from transformers import LlamaForCausalLM

    config = tiny_llama_config()
    with torch.device("meta"):
        params = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    estimate = estimated_weight_bytes(TargetInfo.from_hf_config(config, "tiny"), torch.bfloat16)
    norms = (2 * config.num_hidden_layers + 1) * config.hidden_size  # left out of the estimate
    assert estimate == 2 * (params - norms)
