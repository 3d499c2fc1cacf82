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


# ---- LongSpec: the attention window, anchor offsets, chunked loss ---------------------------------------------


def _features(target, cfg, ids):
    return capture_features(target.model, ids, torch.ones_like(ids), SPEC.feature_layers(cfg, target.info))


def test_windowed_chain_drafting_matches_training_time_test(target):
    """With a window and sinks the inference chain (the layer's own window, no mask) still equals the TTT unroll
    (its mask's window) fed the same tokens."""
    cfg, draft = _draft(target, attention_window=4, attention_sinks=2)
    ids = torch.randint(0, 250, (1, 16))
    feats = _features(target, cfg, ids)
    prefix = 11
    state = ChainState(tokens=ids[:, :prefix + 1], embed=target.model.get_input_embeddings(),
                       features=TargetFeatures({i: h[:, :prefix] for i, h in feats.hidden_states.items()}))
    drafted = eagle3_chain(draft, state, cfg.ttt_steps)
    teacher = ids.clone()
    teacher[0, prefix + 1: prefix + cfg.ttt_steps] = drafted[:-1]
    hidden = {i: h.clone() for i, h in _features(target, cfg, teacher).hidden_states.items()}
    for i in hidden:
        hidden[i][:, :prefix] = feats.hidden_states[i][:, :prefix]
    with torch.no_grad():
        steps = [logits[0, prefix - 1].argmax() for logits in ttt_unroll(draft, hidden, cfg.ttt_steps)]
        full_cfg, full = _draft(target)
        full.load_state_dict(draft.state_dict())
        unwindowed = [logits[0, prefix - 1] for logits in ttt_unroll(full, hidden, cfg.ttt_steps)]
    assert [int(s + draft.d2t[s]) for s in steps] == drafted.tolist()
    windowed = list(ttt_unroll(draft, hidden, cfg.ttt_steps))
    assert not torch.allclose(windowed[0][0, prefix - 1], unwindowed[0])  # the window hid keys


def test_a_short_offset_sequence_trains_what_a_long_context_computes(target):
    """LongSpec's point: with a window w and s sinks, column t of a long sequence sees the sinks and its w newest
    columns; a short sequence of just those tokens, its positions from s on offset to t - w + 1, computes the same
    draft logits at its last column, at every TTT step (training and inference agree on the rotary positions)."""
    sinks, window, t = 2, 5, 19
    cfg, draft = _draft(target, attention_window=window, attention_sinks=sinks)
    ids = torch.randint(0, 250, (1, 24))
    ids[0, t - window + 1] = ids[0, sinks]  # the last sink's key reads the token after it: the same in both
    hidden = _features(target, cfg, ids).hidden_states
    keep = torch.tensor([*range(sinks), *range(t - window + 1, t + 1 + cfg.ttt_steps)])  # +K: the later steps' tokens
    short = {i: h[:, keep] for i, h in hidden.items()}
    positions = keep[None]  # [1, T']: 0..s-1, then t-w+1.. : an offset of t - w + 1 - s after the sinks
    with torch.no_grad():
        long_steps = [logits[0, t] for logits in ttt_unroll(draft, hidden, cfg.ttt_steps)]
        short_steps = [logits[0, sinks + window - 1]
                       for logits in ttt_unroll(draft, short, cfg.ttt_steps, position_ids=positions)]
    for step, (want, got) in enumerate(zip(long_steps, short_steps)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"step {step}")


def test_anchor_offsets_shift_positions_after_the_sinks():
    from specdraft.methods.eagle3.ttt import anchor_offset_positions

    torch.manual_seed(0)
    document_ids = torch.tensor([[0] * 6 + [1] * 4, [0] * 10])
    position_ids = torch.tensor([[*range(6), *range(4)], list(range(10))])
    shifted = anchor_offset_positions(position_ids, document_ids, document_ids.shape, 2, 1000, "cpu")
    offsets = shifted - position_ids
    assert torch.equal(offsets[position_ids < 2], torch.zeros_like(offsets[position_ids < 2]))
    for row, doc in ((0, 0), (0, 1), (1, 0)):  # one offset for each document's non-anchor positions
        moved = offsets[row][(document_ids[row] == doc) & (position_ids[row] >= 2)]
        assert len(set(moved.tolist())) == 1 and 0 <= int(moved[0]) <= 1000
    unpacked = anchor_offset_positions(None, None, torch.Size([3, 8]), 4, 50, "cpu")
    assert torch.equal(unpacked[:, :4], torch.arange(4).expand(3, 4))
    assert (unpacked[:, 4:] - torch.arange(4, 8)).unique(dim=1).shape[1] == 1


def test_offsets_apply_in_training_only(target, monkeypatch):
    """method.position_offset reaches the unroll's positions while the draft trains; validation sees the true
    ones."""
    from specdraft.methods.eagle3 import loss as loss_module

    cfg, draft = _draft(target, position_offset=500)
    ids = torch.randint(0, 250, (2, 12))
    ones = torch.ones_like(ids)
    batch = DraftBatch(input_ids=ids, loss_mask=ones, attention_mask=ones, features=_features(target, cfg, ids))
    seen = []

    def recording_unroll(draft, hidden_states, steps, position_ids=None, *args, **kwargs):
        seen.append(position_ids)
        return ttt_unroll(draft, hidden_states, steps, position_ids, *args, **kwargs)

    out = loss_module.eagle3_loss(draft.train(), batch, cfg, unroll=recording_unroll)
    assert torch.isfinite(out.loss) and seen[0] is not None and int((seen[0] - torch.arange(12)).max()) > 0
    loss_module.eagle3_loss(draft.eval(), batch, cfg, unroll=recording_unroll)
    assert seen[1] is None


def test_chunked_loss_equals_the_whole_batchs(target):
    """method.loss_chunk_rows below the batch's rows: the same loss, metrics and gradients."""
    ids = torch.randint(0, 250, (2, 20))
    ones = torch.ones_like(ids)
    results = []
    for chunk in (0, 7):
        torch.manual_seed(1)
        cfg, draft = _draft(target, loss_chunk_rows=chunk)
        batch = DraftBatch(input_ids=ids, loss_mask=ones, attention_mask=ones, features=_features(target, cfg, ids))
        out = SPEC.loss(draft, batch, cfg)
        out.loss.backward()
        results.append((out.loss.detach(), out.metrics, {n: p.grad.clone() for n, p in draft.named_parameters()}))
    torch.testing.assert_close(results[1][0], results[0][0])
    assert {k: float(v) for k, v in results[1][1].items()} == pytest.approx(
        {k: float(v) for k, v in results[0][1].items()}, rel=1e-5)
    for name, grad in results[0][2].items():
        torch.testing.assert_close(results[1][2][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("field", ["attention_window", "attention_sinks", "position_offset", "loss_chunk_rows"])
def test_negative_long_context_settings_are_one_line_errors(field):
    from specdraft.core.errors import SpecdraftError

    with pytest.raises(SpecdraftError, match=f"method.{field} must be 0"):
        SPEC.config(**{field: -1})


def test_exports_carry_the_window_for_the_engines(target):
    """A windowed draft's hf config and speculators layer config name its sliding window (vLLM's fields); the
    export reads back with its window and sinks; a foreign checkpoint's sliding window is read too."""
    cfg, draft = _draft(target, attention_window=512, attention_sinks=4)
    hf, tensors = SPEC.exports["hf"].write(draft, cfg, target.info, {})
    assert hf["sliding_window"] == 512 and hf["layer_types"] == ["sliding_attention"]
    spec_config, _ = SPEC.exports["speculators"].write(draft, cfg, target.info, {})
    assert spec_config["transformer_layer_config"]["sliding_window"] == 512
    read_cfg, rebuilt = SPEC.from_export(hf, tensors, DraftContext(target.info))
    assert (read_cfg.attention_window, read_cfg.attention_sinks) == (512, 4)
    assert rebuilt.attention_window.size == 512 and rebuilt.midlayer.window.sinks == 4
    foreign = {k: v for k, v in hf.items() if k != "specdraft"}
    assert SPEC.export_config(foreign).attention_window == 512
    plain_cfg, plain = _draft(target)
    assert "sliding_window" not in SPEC.exports["hf"].write(plain, plain_cfg, target.info, {})[0]
