"""Kangaroo adapter: exit layer, shared target head, drafting matches teacher-forced training, export. CPU."""
import json

import pytest
import torch

from specdraft.config import TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.methods import get_method
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures
from specdraft.methods.kangaroo import KangarooConfig, chain_metrics, kangaroo_exit_layer
from specdraft.targets import capture_features, load_target
from specdraft.testing.tiny import tiny_llama_config
from tests.partial_layers import new_layer_cache, run_first_layers
from tests.oracles import ChainState, kangaroo_chain

SPEC = get_method("kangaroo")


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(TargetConfig(path=str(tiny_target_dir)))


def _draft(target, **overrides):
    cfg = SPEC.config(**{"ttt_steps": 4, "exit_layer": 2, **overrides})
    draft = SPEC.build(cfg, DraftContext(target.info, torch.arange(target.info.vocab_size)))
    SPEC.bind_target(draft, target.model)
    return cfg, draft


def _features(target, cfg, ids):
    return capture_features(target.model, ids, torch.ones_like(ids), SPEC.feature_layers(cfg, target.info))


@pytest.mark.parametrize("layers, expected", [(4, 1), (30, 2), (32, 2), (40, 2), (80, 5)])
def test_default_exit_layer_by_depth(layers, expected):
    from specdraft.core.types import TargetInfo

    info = TargetInfo.from_hf_config(tiny_llama_config(layers=layers), "tiny")
    assert kangaroo_exit_layer(KangarooConfig(), info) == expected
    with pytest.raises(SpecdraftError, match=f"valid: 1..{layers - 1}"):
        kangaroo_exit_layer(KangarooConfig(exit_layer=layers), info)


def test_first_layers_equal_the_full_forwards_hidden_state(target):
    ids = torch.randint(0, 250, (1, 11))
    expected = capture_features(target.model, ids, torch.ones_like(ids), [2]).hidden_states[2]
    embed, cache = target.model.get_input_embeddings(), new_layer_cache(target.model)
    head = run_first_layers(target.model, embed(ids[:, :7]), torch.arange(7), cache, 2)
    tail = [run_first_layers(target.model, embed(ids[:, i:i + 1]), torch.tensor([i]), cache, 2) for i in range(7, 11)]
    torch.testing.assert_close(torch.cat([head, *tail], dim=1), expected)


def test_adapter_with_a_cache_equals_one_pass(target):
    _, draft = _draft(target)
    shallow = torch.randn(1, 9, 64)
    positions = torch.arange(9)
    whole, _ = draft(shallow, positions)
    first, kv = draft(shallow[:, :5], positions[:5])
    second, _ = draft(shallow[:, 5:], positions[5:], kv)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)


def test_untrained_identity_adapter_is_the_targets_logit_lens(target):
    _, draft = _draft(target)
    with torch.no_grad():
        draft.self_attn.o_proj.weight.zero_()
    ids = torch.randint(0, 250, (1, 8))
    shallow = _features(target, KangarooConfig(exit_layer=2), ids).hidden_states[2]
    hidden, _ = draft(shallow, torch.arange(8))
    lens = target.model.lm_head(target.model.model.norm(shallow))  # [1, T, V]
    torch.testing.assert_close(draft.target_logits_fn()(hidden), lens)


def test_chain_drafting_matches_teacher_forced_training(target):
    """The adapter's training-time prediction at column t, over the sequence holding the drafted tokens, is
    the drafted token: teacher forcing computes what drafting computes."""
    cfg, draft = _draft(target, draft_vocab_size=200)
    ids = torch.randint(0, 250, (1, 16))
    feats = _features(target, cfg, ids)
    prefix, k = 9, 4
    state = ChainState(tokens=ids[:, :prefix + 1], embed=target.model.get_input_embeddings(),
                       features=TargetFeatures({i: h[:, :prefix] for i, h in feats.hidden_states.items()}))
    drafted = kangaroo_chain(draft, state, k)  # [k]
    teacher = ids.clone()
    teacher[0, prefix + 1: prefix + k] = drafted[:-1]
    shallow = _features(target, cfg, teacher).hidden_states[2]
    with torch.no_grad():
        hidden, _ = draft(shallow, torch.arange(16))
        steps = draft.target_logits_fn()(hidden)[0, prefix: prefix + k].argmax(-1)  # [k] draft indices
    assert (steps + draft.d2t[steps]).tolist() == drafted.tolist()


def test_chain_metrics_follow_consecutive_hits():
    correct = torch.tensor([[True, True, False, True, True, True]])
    mask = torch.ones(1, 6)
    metrics = chain_metrics(correct, mask, 3)
    # chains from each column (capped at 3): 2, 1, 0, 3, 2, 1 -> tau_sim = 1 + 9 / 6
    assert float(metrics["tau_sim"]) == pytest.approx(2.5)
    assert float(metrics["acc@1"]) == pytest.approx(5 / 6)


def test_loss_trains_the_adapter_only_and_decreases(target):
    cfg, draft = _draft(target, draft_vocab_size=150)
    ids = torch.randint(0, 250, (2, 24))
    ones = torch.ones_like(ids)
    batch = DraftBatch(input_ids=ids, loss_mask=ones, attention_mask=ones, features=_features(target, cfg, ids))
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        out = SPEC.loss(draft, batch, cfg)
        optimizer.zero_grad()
        out.loss.backward()
        if not losses:
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in draft.parameters())
            assert target.model.lm_head.weight.grad is None
        optimizer.step()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < 0.85 * losses[0]
    assert {"acc@1", "acc@4", "tau_sim"} <= set(out.metrics)
    assert 1.0 <= float(out.metrics["tau_sim"]) <= 1.0 + cfg.ttt_steps


def test_export_holds_the_adapter_not_the_targets_head(target):
    cfg, draft = _draft(target, draft_vocab_size=100)
    config, tensors = SPEC.exports["hf"].write(draft, cfg, target.info, {"target": "tiny"})
    assert set(tensors) == set(SPEC.exports["hf"].required_keys(draft, target.info))
    assert config["kangaroo_config"]["exit_layer"] == 2 and config["draft_vocab_size"] == 100
    rebuilt_cfg, rebuilt = SPEC.from_export(json.loads(json.dumps(config)), tensors, DraftContext(target.info))
    assert rebuilt_cfg == cfg
    for name, value in draft.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], value), name
    with pytest.raises(SpecdraftError, match="no target bound"):
        rebuilt.target_logits_fn()


def test_packed_rows_and_stored_features_are_refused(target):
    cfg, draft = _draft(target)
    ids = torch.randint(0, 250, (1, 8))
    ones = torch.ones_like(ids)
    batch = DraftBatch(ids, ones, ones, _features(target, cfg, ids), position_ids=torch.arange(8)[None],
                       document_ids=torch.zeros_like(ids))
    with pytest.raises(SpecdraftError, match="unpacked rows"):
        SPEC.loss(draft, batch, cfg)
    with pytest.raises(SpecdraftError, match="data.features=online"):
        SPEC.bind_target(draft, None)


def test_a_zero3_partitioned_target_is_refused(target):
    """Under train.shard_target the bound target's weights are ZeRO-3 partitions (`ds_id`), empty outside its
    forward: the adapter, which runs its final norm and LM head, says which setting to change."""
    spec = get_method("kangaroo")
    draft = spec.build(spec.config(exit_layer=2), DraftContext(target.info))
    head = target.model.get_output_embeddings().weight
    head.ds_id = 0
    try:
        with pytest.raises(SpecdraftError, match="train.shard_target=false"):
            spec.bind_target(draft, target.model)
    finally:
        del head.ds_id
    spec.bind_target(draft, target.model)
