"""train.shard_target resolved (specdraft.train.trainer.shard_target) and the weight estimate `auto` uses. CPU,
instant; the sharded run itself is tests/test_multi_gpu.py (2 GPUs)."""
import pytest
import torch

from specdraft.recipes import load_recipe
from specdraft.core.types import TargetInfo
from specdraft.targets.load import estimated_weight_bytes
from specdraft.testing.tiny import tiny_llama_config
from specdraft.train.trainer import shard_target


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


def test_sharded_target_is_a_frozen_submodule_in_eval_mode(tiny_target_dir, monkeypatch):
    """The module's side of sharding, with the partitioning itself (DeepSpeed, GPUs) left out: the target is
    registered as a submodule (what DeepSpeed's engine gathers), stays in eval mode when Lightning switches the
    module to training, and its features carry the whole LM head copy."""
    from specdraft.config import TargetConfig, TrainConfig
    from specdraft.methods import get_method
    from specdraft.core.types import DraftContext
    from specdraft.targets.load import load_target
    from specdraft.train import features as features_module
    from specdraft.train.module import DraftModule

    monkeypatch.setattr(features_module, "whole_copy", lambda param: param.detach().clone())
    target = load_target(TargetConfig(path=str(tiny_target_dir)))
    spec = get_method("eagle3")
    source = features_module.ShardedOnlineFeatures(lambda: target.model, [1, 2])
    module = DraftModule(spec, spec.config(ttt_steps=2), TrainConfig(), DraftContext(target.info), source)
    module.setup("fit")
    module.configure_model()
    assert module.sharded_target is target.model and not module.strict_loading
    assert all(not p.requires_grad for p in module.sharded_target.parameters())
    module.train()
    assert module.draft.training and not module.sharded_target.training
    ids = torch.arange(8)[None]
    features = source({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert features.lm_head is source.lm_head and torch.equal(source.lm_head, target.model.lm_head.weight)
