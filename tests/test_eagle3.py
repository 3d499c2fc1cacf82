"""EAGLE-3 head: training-time test matches inference drafting; gradients; vocabulary; export layouts. CPU."""
import pytest
import torch

from specdraft.config import TargetConfig
from specdraft.methods import get_method
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures
from specdraft.methods.eagle3 import ttt_unroll
from specdraft.methods.shared import build_draft_vocab
from specdraft.targets import capture_features, load_target
from tests.oracles import ChainState, eagle3_chain

SPEC = get_method("eagle3")


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(TargetConfig(path=str(tiny_target_dir)))


def _draft(target, **overrides):
    cfg = SPEC.config(**{"ttt_steps": 3, "draft_vocab_size": 300, **overrides})
    counts = torch.arange(target.info.vocab_size)  # every id present, so drafted ids are never out of vocab
    return cfg, SPEC.build(cfg, DraftContext(target.info, counts))


def test_draft_vocab_is_most_frequent_ids_sorted():
    counts = torch.tensor([5, 0, 9, 9, 1, 7])
    assert build_draft_vocab(counts, 3).tolist() == [2, 3, 5]


def test_d2t_offsets_and_t2d_mask_agree(target):
    _, draft = _draft(target, draft_vocab_size=16)
    draft_ids = draft.draft_ids()
    assert draft.t2d.sum() == 16 and draft.t2d[draft_ids].all()
    assert torch.equal(draft_ids, torch.sort(draft_ids).values)


def test_chain_drafting_matches_training_time_test(target):
    """Drafting k tokens after a prefix equals the TTT unroll fed the same tokens, step by step."""
    cfg, draft = _draft(target)
    ids = torch.randint(0, 250, (1, 16))
    feats = capture_features(target.model, ids, torch.ones_like(ids), SPEC.feature_layers(cfg, target.info))
    prefix = 9  # features for ids[:, :prefix], newest token ids[:, prefix]
    state = ChainState(tokens=ids[:, :prefix + 1], embed=target.model.get_input_embeddings(),
                       features=TargetFeatures({i: h[:, :prefix] for i, h in feats.hidden_states.items()}))
    drafted = eagle3_chain(draft, state, cfg.ttt_steps)  # [k]
    teacher = ids.clone()
    teacher[0, prefix + 1: prefix + cfg.ttt_steps] = drafted[:-1]  # TTT sees the drafted tokens
    teacher_feats = capture_features(target.model, teacher, torch.ones_like(teacher), list(feats.hidden_states))
    hidden = {i: h.clone() for i, h in teacher_feats.hidden_states.items()}
    for i in hidden:  # features only at columns < prefix matter; keep the original ones there
        hidden[i][:, :prefix] = feats.hidden_states[i][:, :prefix]
    with torch.no_grad():
        steps = [logits[0, prefix - 1].argmax() for logits in ttt_unroll(draft, hidden, cfg.ttt_steps)]
    assert [int(s + draft.d2t[s]) for s in steps] == drafted.tolist()


def test_loss_trains_every_parameter_and_decreases(target):
    cfg, draft = _draft(target)
    ids = torch.randint(0, 250, (2, 24))
    ones = torch.ones_like(ids)
    feats = capture_features(target.model, ids, ones, SPEC.feature_layers(cfg, target.info))
    batch = DraftBatch(input_ids=ids, loss_mask=ones, attention_mask=ones, features=feats)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        out = SPEC.loss(draft, batch, cfg)
        optimizer.zero_grad()
        out.loss.backward()
        if not losses:
            frozen = [n for n, p in draft.named_parameters() if p.grad is None or not p.grad.abs().sum()]
            assert frozen == []
        optimizer.step()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < 0.85 * losses[0]
    assert set(out.metrics) >= {"acc@1", "acc@3", "tau_sim"}
    assert 1.0 <= float(out.metrics["tau_sim"]) <= 1.0 + cfg.ttt_steps


@pytest.mark.parametrize("method, settings", [("eagle3", {}),
                                               ("poss", {"num_specialists": 3, "positions_per_specialist": 1})])
def test_draft_layers_take_only_their_states_positionally(target, method, settings):
    """ZeRO-3 wraps every positional tensor of a module call in an autograd Function (its backward hooks), so the
    TTT unroll gives a draft layer only hidden and embeds positionally; the cache, which grows with every step,
    and the positions and columns go as keywords."""
    from specdraft.methods.eagle3 import Eagle3DecoderLayer

    spec = get_method(method)
    cfg = spec.config(ttt_steps=3, draft_vocab_size=300, **settings)
    draft = spec.build(cfg, DraftContext(target.info, torch.arange(target.info.vocab_size)))
    ids = torch.randint(0, 250, (2, 16))
    ones = torch.ones_like(ids)
    feats = capture_features(target.model, ids, ones, spec.feature_layers(cfg, target.info))
    calls = []
    hooks = [layer.register_forward_pre_hook(lambda module, args, kwargs: calls.append((len(args), set(kwargs))),
                                             with_kwargs=True)
             for layer in draft.modules() if isinstance(layer, Eagle3DecoderLayer)]
    spec.loss(draft, DraftBatch(input_ids=ids, loss_mask=ones, attention_mask=ones, features=feats), cfg)
    for hook in hooks:
        hook.remove()
    assert len(calls) == cfg.ttt_steps
    assert all(positional == 2 and {"cache", "positions", "query_cols"} <= keywords for positional, keywords in calls)


def test_padding_and_prompt_tokens_carry_no_loss(target):
    cfg, draft = _draft(target)
    ids = torch.randint(0, 250, (1, 12))
    zeros = torch.zeros_like(ids)
    feats = capture_features(target.model, ids, torch.ones_like(ids), SPEC.feature_layers(cfg, target.info))
    out = SPEC.loss(draft, DraftBatch(ids, zeros, torch.ones_like(ids), feats), cfg)
    assert float(out.loss) == 0.0 and float(out.metrics["tau_sim"]) == 1.0


@pytest.mark.parametrize("fmt", ["hf", "speculators"])
def test_export_layouts_round_trip(target, fmt):
    cfg, draft = _draft(target)
    config, tensors = SPEC.exports[fmt].write(draft, cfg, target.info, {"target": "tiny"})
    assert set(SPEC.exports[fmt].required_keys(draft, target.info)) <= set(tensors)
    assert "embed_tokens.weight" not in tensors
    assert config["draft_vocab_size"] == 300
    _, rebuilt = SPEC.from_export(config, tensors, DraftContext(target.info))
    for name, value in draft.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], value), name


def test_hf_export_names_sglang_layers(target):
    cfg, draft = _draft(target)
    config, tensors = SPEC.exports["hf"].write(draft, cfg, target.info, {})
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 1, 0]  # L=4: inputs of 2, 2, 1
    assert "midlayer.self_attn.q_proj.weight" in tensors
    assert tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * target.info.hidden_size


def test_loss_is_the_same_with_reference_kernels(target, monkeypatch):
    cfg, draft = _draft(target)
    ids = torch.randint(0, 250, (2, 20))
    ones = torch.ones_like(ids)
    feats = capture_features(target.model, ids, ones, SPEC.feature_layers(cfg, target.info))
    batch = DraftBatch(input_ids=ids, loss_mask=ones, attention_mask=ones, features=feats)
    results = []
    for kernels in ("auto", "reference"):
        monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
        draft.zero_grad()
        out = SPEC.loss(draft, batch, cfg)
        out.loss.backward()
        results.append((out.loss.detach(), draft.fc.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_teacher_logits_equal_the_targets_own(target):
    """The teacher computed from the final hidden state and LM-head rows equals the HF forward's logits."""
    ids = torch.randint(0, 250, (2, 9))
    feats = capture_features(target.model, ids, torch.ones_like(ids), [1])
    with torch.no_grad():
        full_logits = target.model(input_ids=ids).logits  # [B, T, V]
    vocab_ids = torch.tensor([3, 17, 40, 41, 300])
    torch.testing.assert_close(feats.logits_for(vocab_ids), full_logits[..., vocab_ids], rtol=1e-4, atol=1e-4)
    mask = torch.zeros(full_logits.shape[-1], dtype=torch.bool)
    mask[::3] = True
    expected = mask[full_logits.argmax(-1)]
    assert torch.equal(feats.argmax_in(mask, vocab_chunk=7), expected)
