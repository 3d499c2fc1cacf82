"""DeepSpeed's share of the training step without host syncs (specdraft.train.deepspeed_step): the configuration
the trainer gives DeepSpeed, and a ZeRO-2 rank on the CPU (gloo, bf16) stepping with it against DeepSpeed's own
settings: no host read and no device sync a step, and the same weights."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdraft.config import TrainConfig
from specdraft.train.deepspeed_step import clip_scale, mask_invalid_norm, step_config
from specdraft.testing.ports import free_port
from tests.host_reads import HostReads

REPO = Path(__file__).resolve().parents[1]


def test_step_config_turns_off_the_synchronizing_defaults():
    config = step_config(2, "bf16-mixed")
    assert config["bf16"] == {"enabled": True, "check_grad_overflow": False}
    assert config["zero_optimization"] == {"overlap_comm": False}
    assert config["timers"]["throughput"]["enabled"] is False
    assert "bf16" not in step_config(2, "32-true")  # fp32 training stays fp32
    assert "overlap_comm" not in step_config(3, "bf16-mixed")["zero_optimization"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="builds the DeepSpeed strategy, which a GPU machine runs")
def test_the_trainer_merges_them_under_train_deepspeed(monkeypatch):
    from specdraft.train import trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    cfg = TrainConfig(strategy="deepspeed_stage_2", deepspeed={"zero_optimization": {"overlap_comm": True}})
    config = trainer._strategy(cfg, None).config
    assert config["zero_optimization"]["overlap_comm"] is True  # the recipe's train.deepspeed has the last word
    assert config["bf16"]["check_grad_overflow"] is False
    assert config["zero_optimization"]["contiguous_gradients"] is True  # Lightning's own entries stay


def test_clip_scale_clips_on_the_device_as_deepspeed_does():
    assert clip_scale(torch.tensor(2.0), 0.0, 1.0) is None
    assert clip_scale(torch.tensor(2.0), 0.0, 4.0) == 0.25
    torch.testing.assert_close(clip_scale(torch.tensor(0.1), 0.5, 1.0), torch.tensor(1.0))  # below the clip
    torch.testing.assert_close(clip_scale(torch.tensor(2.0), 0.5, 1.0), torch.tensor(0.5 / (2.0 + 0.5e-6)))
    for invalid in (float("nan"), float("inf"), -1.0):  # DeepSpeed's sentinel for a non-finite norm is -1
        assert clip_scale(torch.tensor(invalid), 0.5, 1.0).item() == 0.0
    with HostReads() as reads:
        clip_scale(torch.tensor(2.0), 0.5, 1.0)
    assert reads.count == 0


def test_the_norm_mask_fills_as_deepspeeds_without_a_host_tensor_or_read():
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace

    for values in ([2.0], [float("nan")], [float("inf")], [float("-inf")], [0.0, float("nan"), 3.0]):
        ours, theirs = torch.tensor(values), torch.tensor(values)
        with HostReads() as reads:
            mask_invalid_norm(ours, device="cpu")
        mask_nan_or_inf_with_val_inplace(theirs, device="cpu")
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        assert reads.count == 0 and reads.uploads == 0
    norm = torch.tensor([1.0])
    with HostReads() as reads:
        mask_nan_or_inf_with_val_inplace(norm, device="cpu")
    assert reads.count == 1 and reads.uploads == 1  # DeepSpeed's: its -1 built on the host, then read back


def test_the_group_norms_combine_as_deepspeeds():
    from deepspeed.runtime.utils import combine_grad_norm_groups

    from specdraft.train.deepspeed_step import combine_norms

    inf, nan = float("inf"), float("nan")
    for groups in ([3.0], [3.0, 4.0], [-1.0], [nan], [inf], [-inf, 2.0], [0.0], [2.0, -1.0]):
        tensors = [torch.tensor(value) for value in groups]
        ours, theirs = combine_norms(tensors), combine_grad_norm_groups(tensors)
        assert torch.equal(ours, theirs) and ours.dtype == theirs.dtype, (groups, ours, theirs)
    assert torch.equal(combine_norms([2.0, torch.tensor(1.5)]), combine_grad_norm_groups([2.0, torch.tensor(1.5)]))


def test_a_zero2_step_reads_nothing_back_and_matches_deepspeeds():
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.deepspeed_step_run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ours, theirs, single = result["ours"], result["deepspeed"], result["single_rank"]
    assert ours["replaced"] is True
    assert ours["reads"] == [0, 0, 0] and ours["uploads"] == [0, 0, 0] and ours["syncs"] == [0, 0, 0], ours
    # the overflow flag, the norm check in step and in the clip, the norm's mask (its -1 read back in the fill)
    assert min(theirs["reads"]) >= 4, theirs
    assert min(theirs["uploads"]) >= 1, theirs  # the norm's mask builds its -1 on the host
    assert ours["last_grad_norm"] > 0.05  # the steps were clipped
    assert ours["last_grad_norm"] == theirs["last_grad_norm"]
    # the norm: one foreach norm for 4 tensors, not an fp64 copy and a norm each; its mask, combination, clip shorter
    assert max(ours["step_ops"]) <= min(theirs["step_ops"]) - 20, (ours["step_ops"], theirs["step_ops"])
    for mine, reference in zip(ours["weights"], theirs["weights"]):
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(reference), rtol=0, atol=0)
    # one rank's settings (the bucket all-reduced whole, not reduce-scattered): the very same steps
    assert single["reads"] == [0, 0, 0] and single["uploads"] == [0, 0, 0] and single["syncs"] == [0, 0, 0]
    assert single["weights"] == ours["weights"]


def test_a_single_rank_reduces_its_bucket_whole():
    """What single_rank_config turns off on one rank: the reduce-scatter's per-rank slices."""
    from specdraft.train.deepspeed_step import single_rank_config

    assert single_rank_config(2, 1) == {"zero_optimization": {"reduce_scatter": False}}
    assert single_rank_config(2, 2) == {} and single_rank_config(2, 0) == {}  # several (or unknown) ranks
    assert single_rank_config(3, 1) == {} and single_rank_config(1, 1) == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="builds the DeepSpeed strategy, which a GPU machine runs")
def test_the_trainer_leaves_reduce_scatter_to_the_strategy_unless_the_recipe_sets_it(monkeypatch):
    from specdraft.train import trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    strategy = trainer._strategy(TrainConfig(strategy="deepspeed_stage_2"), None)
    assert strategy.single_rank_zero is True and strategy.config["zero_optimization"]["reduce_scatter"] is True
    for value in (True, False):
        own = {"zero_optimization": {"reduce_scatter": value}}
        strategy = trainer._strategy(TrainConfig(strategy="deepspeed_stage_2", deepspeed=own), None)
        assert strategy.single_rank_zero is False and strategy.config["zero_optimization"]["reduce_scatter"] is value


def _reduce_scatter_built(monkeypatch, world_size: int, stage: int = 2, **kwargs):
    """reduce_scatter in the config DeepSpeed's engine would be built from, on `world_size` ranks."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from specdraft.train import resharding

    built = []

    def build_engine(self, model, optimizer, lr_scheduler=None):
        built.append(self.config["zero_optimization"]["reduce_scatter"])
        return SimpleNamespace(module=model), None

    monkeypatch.setattr(DeepSpeedStrategy, "_setup_model_and_optimizer", build_engine)
    monkeypatch.setattr(resharding, "zero_step_on_device", lambda zero_optimizer: False)
    environment = LightningEnvironment()
    environment.set_world_size(world_size)
    strategy = resharding.ReshardingDeepSpeedStrategy(stage=stage, cluster_environment=environment, **kwargs)
    strategy._setup_model_and_optimizer(torch.nn.Linear(2, 2), None)
    return built[0]


def test_the_strategy_reduces_a_single_ranks_bucket_whole(monkeypatch):
    assert _reduce_scatter_built(monkeypatch, 1) is False
    assert _reduce_scatter_built(monkeypatch, 2) is True  # Lightning's own on several ranks
    assert _reduce_scatter_built(monkeypatch, 1, stage=1) is True
    assert _reduce_scatter_built(monkeypatch, 1, single_rank_zero=False) is True  # the recipe's value stays


@pytest.mark.slow
def test_the_strategys_engine_reduces_a_single_ranks_bucket_whole(tmp_path):
    """DeepSpeed engines built by the strategy on the CPU (gloo): one rank all-reduces whole, unless the recipe
    says otherwise; two ranks keep Lightning's reduce-scatter."""
    from tests.test_resharding import run_ranks

    def built(world: int, recipe_value: str) -> dict:
        out = tmp_path / f"{world}-{recipe_value}.json"
        run_ranks(world, "strategy", 2, recipe_value, out)
        return json.loads(out.read_text())

    assert built(1, "-") == {"engine": False, "optimizer": False}
    assert built(1, "true") == {"engine": True, "optimizer": True}
    assert built(2, "-") == {"engine": True, "optimizer": True}


def test_the_trainers_strategy_steps_its_zero_optimizer_without_host_syncs(monkeypatch):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from specdraft.train import resharding

    built, zero_optimizer = SimpleNamespace(module=torch.nn.Linear(2, 2)), object()
    monkeypatch.setattr(DeepSpeedStrategy, "_setup_model_and_optimizer",
                        lambda self, model, optimizer, lr_scheduler=None: (built, zero_optimizer))
    replaced = []
    monkeypatch.setattr(resharding, "zero_step_on_device", replaced.append)
    strategy = resharding.ReshardingDeepSpeedStrategy(stage=2)
    assert strategy._setup_model_and_optimizer(built.module, None) == (built, zero_optimizer)
    assert replaced == [zero_optimizer]


def test_zero3_persist_auto_keeps_weights_whole_up_to_a_sixteenth_of_the_gpu():
    from specdraft.train.zero3 import persist_weights, persistence_config, weight_bytes

    module = torch.nn.Linear(1024, 512, bias=False).bfloat16()  # 1 MiB of weights
    assert weight_bytes(module) == 2 ** 20
    assert persist_weights("auto", module, device_memory=16 * 2 ** 20)
    assert not persist_weights("auto", module, device_memory=16 * 2 ** 20 - 1)
    assert persist_weights("true", module, device_memory=0) and not persist_weights("false", module, 2 ** 40)
    assert persistence_config(module) == {"stage3_param_persistence_threshold": 1024 * 512}


def test_an_eagle3_draft_at_llama_8b_shapes_is_kept_whole_on_an_80gb_gpu():
    """What docs/training.md states: 425M weights, 0.85 GB in bf16, under 1/16 of an 80 GB card."""
    from transformers import LlamaConfig

    from specdraft.core.types import DraftContext, TargetInfo
    from specdraft.methods import get_method
    from specdraft.train.zero3 import persist_weights, weight_bytes

    shape = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256)
    info = TargetInfo.from_hf_config(LlamaConfig(**shape), "llama8b")
    spec, ctx = get_method("eagle3"), DraftContext(target=info, token_counts=torch.ones(info.vocab_size))
    with torch.device("meta"):  # shapes only
        draft = spec.build(spec.config(ttt_steps=7, draft_vocab_size=32000), ctx).bfloat16()
    assert sum(p.numel() for p in draft.parameters()) == 424_689_664
    assert weight_bytes(draft) == 849_379_328
    assert persist_weights("auto", draft, device_memory=80 * 10 ** 9)


@pytest.mark.skipif(torch.cuda.is_available(), reason="builds the DeepSpeed strategy, which a GPU machine runs")
def test_the_trainer_passes_zero3_persist_unless_train_deepspeed_sets_a_threshold(monkeypatch):
    from specdraft.train import trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert trainer._strategy(TrainConfig(strategy="deepspeed_stage_3"), None).zero3_persist == "auto"
    assert trainer._strategy(TrainConfig(strategy="deepspeed_stage_3", zero3_persist=False), None).zero3_persist \
        == "false"
    own = {"zero_optimization": {"stage3_param_persistence_threshold": 100}}
    strategy = trainer._strategy(TrainConfig(strategy="deepspeed_stage_3", deepspeed=own), None)
    assert strategy.zero3_persist == "false"  # the recipe's threshold decides
    assert strategy.config["zero_optimization"]["stage3_param_persistence_threshold"] == 100
