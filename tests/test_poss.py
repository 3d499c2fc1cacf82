"""PosS: specialists routed by TTT step, drafting matches training-time test, EAGLE-3 initialisation, export. CPU."""
import json

import pytest
import torch
from safetensors.torch import save_file

from specdraft.config import TargetConfig
from specdraft.recipes import load_recipe, save_recipe
from specdraft.drafts import EXPORT_FILE, load_draft
from specdraft.core.errors import SpecdraftError
from specdraft.methods import get_method
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures
from specdraft.methods.eagle3 import ttt_unroll
from specdraft.methods.poss import PossConfig, poss_unroll, specialist_prefix_kv
from specdraft.targets import capture_features, load_target
from tests.oracles import ChainState, poss_chain

SPEC = get_method("poss")
EAGLE3 = get_method("eagle3")


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(TargetConfig(path=str(tiny_target_dir)))


def _counts(target):
    return torch.arange(target.info.vocab_size)  # every id present: drafted ids are never out of vocab


def _draft(target, **overrides):
    cfg = SPEC.config(**{"ttt_steps": 3, "draft_vocab_size": 300, "num_specialists": 3,
                         "positions_per_specialist": 1, **overrides})
    return cfg, SPEC.build(cfg, DraftContext(target.info, _counts(target)))


def _features(target, cfg, ids):
    return capture_features(target.model, ids, torch.ones_like(ids), SPEC.feature_layers(cfg, target.info))


def _unroll_logits(unroll, draft, hidden_states, steps):
    with torch.no_grad():
        return [logits for logits in unroll(draft, hidden_states, steps)]


def test_specialist_by_step():
    cfg = PossConfig(ttt_steps=7, num_specialists=3, positions_per_specialist=2)
    assert cfg.num_specialists == 3
    with pytest.raises(SpecdraftError, match="num_specialists=4 leaves specialists untrained"):
        PossConfig(ttt_steps=6, num_specialists=4, positions_per_specialist=2)
    with pytest.raises(SpecdraftError, match="must be >= 1"):
        PossConfig(positions_per_specialist=0)


def test_routing_uses_the_specialist_of_each_step(target):
    _, draft = _draft(target, ttt_steps=5, num_specialists=3, positions_per_specialist=2)
    assert [draft.specialist_for(step) for step in range(7)] == [0, 0, 1, 1, 2, 2, 2]
    ids = torch.randint(0, 250, (1, 12))
    feats = _features(target, SPEC.config(ttt_steps=5, num_specialists=3), ids).hidden_states
    before = _unroll_logits(poss_unroll, draft, feats, 5)
    with torch.no_grad():
        draft.specialists[1].self_attn.o_proj.weight.mul_(3.0)
    after = _unroll_logits(poss_unroll, draft, feats, 5)
    assert all(torch.equal(before[i], after[i]) for i in (0, 1))  # specialist 0 only
    assert all(not torch.allclose(before[i], after[i]) for i in (2, 3, 4))  # specialist 1, then its outputs


def test_prefix_keys_equal_what_the_layer_writes(target):
    _, draft = _draft(target)
    fused, embeds = torch.randn(2, 7, 64), torch.randn(2, 7, 64)
    cols = torch.arange(7)
    for layer in draft.specialists:
        _, written = layer(fused, embeds, cols, cols, [])
        projected = specialist_prefix_kv(layer, fused, embeds, cols)
        for a, b in zip(written, projected):
            torch.testing.assert_close(a, b)


def test_chain_drafting_matches_training_time_test(target):
    """Drafting k tokens after a prefix equals the TTT unroll fed the same tokens, step by step."""
    cfg, draft = _draft(target, ttt_steps=4, num_specialists=2, positions_per_specialist=2)
    ids = torch.randint(0, 250, (1, 16))
    feats = _features(target, cfg, ids)
    prefix = 9  # features for ids[:, :prefix], newest token ids[:, prefix]
    state = ChainState(tokens=ids[:, :prefix + 1], embed=target.model.get_input_embeddings(),
                       features=TargetFeatures({i: h[:, :prefix] for i, h in feats.hidden_states.items()}))
    drafted = poss_chain(draft, state, cfg.ttt_steps)  # [k]
    teacher = ids.clone()
    teacher[0, prefix + 1: prefix + cfg.ttt_steps] = drafted[:-1]  # TTT sees the drafted tokens
    teacher_feats = capture_features(target.model, teacher, torch.ones_like(teacher), list(feats.hidden_states))
    hidden = {i: h.clone() for i, h in teacher_feats.hidden_states.items()}
    for i in hidden:  # features only at columns < prefix matter; keep the original ones there
        hidden[i][:, :prefix] = feats.hidden_states[i][:, :prefix]
    steps = [logits[0, prefix - 1].argmax() for logits in _unroll_logits(poss_unroll, draft, hidden, cfg.ttt_steps)]
    assert [int(s + draft.d2t[s]) for s in steps] == drafted.tolist()


def test_loss_trains_every_specialist_and_decreases(target):
    cfg, draft = _draft(target)
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
            frozen = [n for n, p in draft.named_parameters() if p.grad is None or not p.grad.abs().sum()]
            assert frozen == []
        optimizer.step()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < 0.85 * losses[0]
    assert {"acc@1", "acc@3", "tau_sim"} <= set(out.metrics)


def _eagle3_export(directory, target_dir, target, **method):
    """An EAGLE-3 `hf` export directory (config.json, weights, recipe) of a random head."""
    method_yaml = ", ".join(f"{k}: {v}" for k, v in {"name": "eagle3", **method}.items())
    (directory / "r.yaml").write_text(f"target: {{path: {target_dir}}}\nmethod: {{{method_yaml}}}\n")
    recipe = load_recipe(directory / "r.yaml")
    draft = EAGLE3.build(recipe.method, DraftContext(target.info, torch.randint(0, 50, (target.info.vocab_size,))))
    config, tensors = EAGLE3.exports["hf"].write(draft, recipe.method, target.info, {})
    out = directory / "export"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / EXPORT_FILE))
    save_recipe(recipe, out)
    return out, draft


def test_init_from_eagle3_computes_what_eagle3_computes(tmp_path, tiny_target_dir, target):
    source, eagle3 = _eagle3_export(tmp_path, tiny_target_dir, target, ttt_steps=3, draft_vocab_size=300)
    cfg, draft = _draft(target, init_from=str(source))
    SPEC.initialize(draft, cfg, DraftContext(target.info, _counts(target), warm_start=_source(source, target)))
    assert torch.equal(draft.d2t, eagle3.d2t) and torch.equal(draft.t2d, eagle3.t2d)
    ids = torch.randint(0, 250, (2, 14))
    feats = _features(target, cfg, ids).hidden_states
    poss_logits = _unroll_logits(poss_unroll, draft, feats, 3)
    eagle3_logits = _unroll_logits(ttt_unroll, eagle3, feats, 3)
    for step, (poss_step, eagle3_step) in enumerate(zip(poss_logits, eagle3_logits)):
        columns = ids.shape[1] - 1 - step  # later columns read past the row's end (no loss there), differently
        torch.testing.assert_close(poss_step[:, :columns], eagle3_step[:, :columns])


def test_init_from_rejects_what_does_not_fit(tmp_path, tiny_target_dir, target):
    source, _ = _eagle3_export(tmp_path, tiny_target_dir, target, draft_vocab_size=200)
    cfg, draft = _draft(target, init_from=str(source))
    with pytest.raises(SpecdraftError, match="does not fit this PosS head"):
        SPEC.initialize(draft, cfg, DraftContext(target.info, warm_start=_source(source, target)))
    cfg, draft = _draft(target, init_from=str(source), draft_vocab_size=200, feature_layers=[1, 2, 3])
    with pytest.raises(SpecdraftError, match="fuses layers"):
        SPEC.initialize(draft, cfg, DraftContext(target.info, warm_start=_source(source, target)))


def test_eagle3_warm_starts_from_its_own_export(tmp_path, tiny_target_dir, target):
    source, eagle3 = _eagle3_export(tmp_path, tiny_target_dir, target, ttt_steps=3, draft_vocab_size=300)
    cfg = EAGLE3.config(ttt_steps=3, draft_vocab_size=300, init_from=str(source))
    torch.manual_seed(1)
    draft = EAGLE3.build(cfg, DraftContext(target.info, _counts(target)))
    EAGLE3.initialize(draft, cfg, DraftContext(target.info, _counts(target), warm_start=_source(source, target)))
    for name, value in eagle3.state_dict().items():
        assert torch.equal(draft.state_dict()[name], value), name
    small = EAGLE3.config(ttt_steps=3, draft_vocab_size=200, init_from=str(source))
    with pytest.raises(SpecdraftError, match="does not fit this EAGLE-3 head"):
        EAGLE3.initialize(EAGLE3.build(small, DraftContext(target.info)), small,
                          DraftContext(target.info, warm_start=_source(source, target)))


def test_hf_export_says_which_specialist_serves_which_depth(target):
    cfg, draft = _draft(target, ttt_steps=7, num_specialists=3, positions_per_specialist=2)
    config, tensors = SPEC.exports["hf"].write(draft, cfg, target.info, {"target": "tiny"})
    assert config["architectures"] == ["PossEagle3Draft"]
    assert config["poss_config"]["specialist_by_depth"] == [0, 0, 1, 1, 2, 2, 2]
    assert set(SPEC.exports["hf"].required_keys(draft, target.info)) == set(tensors)
    assert "specialists.2.self_attn.q_proj.weight" in tensors and "embed_tokens.weight" not in tensors
    rebuilt_cfg, rebuilt = SPEC.from_export(json.loads(json.dumps(config)), tensors, DraftContext(target.info))
    assert rebuilt_cfg == cfg
    for name, value in draft.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], value), name


def test_trainer_initialises_from_eagle3(tmp_path, tiny_target_dir, target):
    from specdraft.config import TrainConfig
    from specdraft.drafts import warm_start_draft
    from specdraft.train.module import DraftModule

    source, eagle3 = _eagle3_export(tmp_path, tiny_target_dir, target, ttt_steps=3, draft_vocab_size=300)
    cfg = SPEC.config(ttt_steps=3, draft_vocab_size=300, num_specialists=3, positions_per_specialist=1,
                      init_from=str(source))
    ctx = DraftContext(target.info, _counts(target), warm_start=warm_start_draft(SPEC, cfg, target.info))
    module = DraftModule(SPEC, cfg, TrainConfig(), ctx, target.model)
    module.configure_model()
    for layer in module.draft.specialists:
        torch.testing.assert_close(layer.self_attn.q_proj.weight, eagle3.midlayer.self_attn.q_proj.weight)
    torch.testing.assert_close(module.draft.fc.weight, eagle3.fc.weight)


def _packing_run(target, batch, attention="dense", checkpointing=False):
    import warnings

    cfg = SPEC.config(ttt_steps=3, draft_vocab_size=300, num_specialists=2, positions_per_specialist=2,
                      attention=attention)
    torch.manual_seed(0)
    draft = SPEC.build(cfg, DraftContext(target.info, _counts(target)))
    draft.activation_checkpointing = checkpointing
    features = capture_features(target.model, batch["input_ids"], batch["attention_mask"],
                                SPEC.feature_layers(cfg, target.info), position_ids=batch.get("position_ids"))
    draft_batch = DraftBatch(batch["input_ids"], batch["loss_mask"], batch["attention_mask"], features,
                             position_ids=batch.get("position_ids"), document_ids=batch.get("document_ids"))
    backward = attention != "flex"  # flex attention has no backward on the CPU
    with warnings.catch_warnings(), torch.set_grad_enabled(backward):
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        out = SPEC.loss(draft, draft_batch, cfg)
        if backward:
            out.loss.backward()
    return out, {name: p.grad for name, p in draft.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention, checkpointing", [("dense", False), ("flex", False), ("dense", True),
                                                      ("dense", "selective"), ("dense", "swiglu")])
def test_packed_rows_give_the_unpacked_loss_and_gradients(target, attention, checkpointing):
    """Several conversations per row (per-document positions and attention, prefix keys of every specialist
    included), flex attention and activation checkpointing: the loss of one conversation per row."""
    from specdraft.train.data import collate, collate_packed
    from tests.distilled import random_conversation_rows

    rows = random_conversation_rows()
    unpacked, unpacked_grads = _packing_run(target, collate(rows, max_length=16))
    packed, packed_grads = _packing_run(target, collate_packed(rows, max_length=16, pack_length=24), attention,
                                        checkpointing)
    assert float(unpacked.loss.detach()) > 0
    torch.testing.assert_close(packed.loss, unpacked.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed.metrics["tau_sim"], unpacked.metrics["tau_sim"])
    assert len(packed_grads) == (0 if attention == "flex" else len(unpacked_grads))
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, unpacked_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def _source(path, target):
    """The draft `init_from` names, as the trainer loads it."""
    return load_draft(path, target=target.info).draft
