"""P-EAGLE on its own (CPU, tiny): one-line config errors naming the key, conditional drop-token sampling's sizes
and draws, the loss training a tiny head, and the runtime drafter's block capability (tests/runtime/
test_method_drafters.py decodes with it losslessly; tests/kernels/test_rollout_attention.py checks the attention)."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.methods.peagle import PEagleConfig, cod_sizes, resolve_mask_token, sample_rollout
from specdraft.testing.tiny import tiny_llama_config


@pytest.mark.parametrize("settings, key", [({"num_depths": 0}, "method.num_depths"),
                                           ({"keep_ratio": 0.0}, "method.keep_ratio"),
                                           ({"keep_floor": 1.5}, "method.keep_floor"),
                                           ({"depth_loss_decay": 0.0}, "method.depth_loss_decay"),
                                           ({"mask_token_id": -1}, "method.mask_token_id"),
                                           ({"attention": "sparse"}, "method.attention")])
def test_a_bad_setting_is_one_line_naming_its_key(settings, key):
    with pytest.raises(SpecdraftError, match=key) as raised:
        PEagleConfig(**settings)
    assert "\n" not in str(raised.value)


def test_a_mask_token_outside_the_vocabulary_names_the_valid_range():
    from transformers import LlamaConfig

    info = TargetInfo.from_hf_config(LlamaConfig(**{**tiny_llama_config().to_dict(), "eos_token_id": 2}), "tiny")
    vocab = info.vocab_size
    assert resolve_mask_token(PEagleConfig(), info) == 2
    with pytest.raises(SpecdraftError, match=f"0..{vocab - 1}"):
        resolve_mask_token(PEagleConfig(mask_token_id=vocab), info)


def test_cod_sizes_decay_to_the_floor_and_never_grow():
    sizes = cod_sizes(100, PEagleConfig(num_depths=8, keep_ratio=0.5, keep_floor=0.2))
    assert sizes == [100, 50, 25, 20, 20, 20, 20, 20]


def test_sampling_keeps_each_depth_among_the_last_and_priority_first():
    torch.manual_seed(0)
    columns, sizes = 30, [30, 20, 10]
    priority = [torch.ones(2, columns, dtype=torch.bool)] + [torch.arange(columns).expand(2, -1) < 12] * 2
    rollout = sample_rollout(priority, sizes)
    assert rollout.anchors.shape == rollout.groups.shape == (2, sum(sizes))
    for group in (1, 2):
        kept, before = rollout.group_anchors(group), rollout.group_anchors(group - 1)
        assert torch.equal(before.gather(1, rollout.parents[group - 1]), kept)  # parents index the group before
        assert bool((kept[:, 1:] > kept[:, :-1]).all())  # column order
        first = (kept < 12).sum(1)
        assert bool((first == min(12, sizes[group])).all())  # every priority column before any other
