"""DFlash (specdraft/methods/dflash) on a tiny random target, CPU: the block attention mask against a brute-force
one on random anchors (packed rows too) and flex attention against the dense path; anchors, position weights, the
loss (every trained weight gets a gradient, it falls), a trained draft vocabulary, the one-line config errors, the
hf layout's refusal of a draft with its own head, and reading a DFlash checkpoint specdraft did not write."""
import math

import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftBatch, DraftContext, TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.methods import get_method
from specdraft.methods.dflash import DFlashConfig, dflash_export_config, dflash_to_hf, dflash_to_speculators
from specdraft.methods.dflash.blocks import (Anchors, BlockMask, anchor_candidates, block_attention,
                                             dense_block_mask, flex_block_mask, sample_anchors)
from specdraft.methods.dflash.loss import block_inputs, position_weights
from specdraft.targets import capture_features
from specdraft.testing.tiny import tiny_llama_config

SPEC = get_method("dflash")


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config(layers=4)).eval()


def _info(model):
    return TargetInfo.from_hf_config(model.config, "tiny")


def _brute_force_mask(anchors: Anchors, block: int, cols: int, documents) -> torch.Tensor:
    batch, count = anchors.positions.shape
    queries = count * block
    mask = torch.zeros(batch, queries, cols + queries, dtype=torch.bool)
    for b in range(batch):
        for q in range(queries):
            anchor = int(anchors.positions[b, q // block])
            for j in range(cols):
                mask[b, q, j] = j < anchor and (documents is None or documents[b, j] == documents[b, anchor])
            for j in range(queries):
                mask[b, q, cols + j] = j // block == q // block
    return mask


def _random_anchors(batch, cols, count, seed):
    generator = torch.Generator().manual_seed(seed)
    positions = torch.sort(torch.stack([torch.randperm(cols, generator=generator)[:count] for _ in range(batch)]),
                           dim=1).values
    return Anchors(positions=positions, valid=torch.ones_like(positions, dtype=torch.bool))


@pytest.mark.parametrize("packed", [False, True])
def test_the_block_mask_is_the_brute_force_one_on_random_anchors(packed):
    cols, block = 13, 4
    anchors = _random_anchors(2, cols, 5, seed=1 + packed)
    documents = torch.tensor([[0] * 5 + [1] * 8, [0] * 9 + [1] * 4]) if packed else None
    expected = _brute_force_mask(anchors, block, cols, documents)
    assert torch.equal(dense_block_mask(anchors, block, cols, documents), expected)
    # flex attention over its BlockMask (eager on the CPU) attends exactly as the dense mask does
    q = torch.randn(2, 4, 5 * block, 8)
    k, v = torch.randn(2, 2, cols + 5 * block, 8), torch.randn(2, 2, cols + 5 * block, 8)
    dense = block_attention(q, k, v, BlockMask(dense=expected))
    flex = block_attention(q, k, v, BlockMask(flex=flex_block_mask(anchors, block, cols, documents)))
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_anchors_are_distinct_sorted_candidates_and_fillers_carry_no_loss():
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1, 0], [0, 1, 1, 0, 0, 0, 0, 0, 0, 0]])
    attention = torch.ones_like(loss_mask)
    candidates = anchor_candidates(loss_mask, attention, None)
    assert candidates[0].nonzero().flatten().tolist() == [2, 3, 4, 7] and candidates[1].nonzero().flatten().tolist() == [1]
    anchors = sample_anchors(candidates, 3, torch.Generator().manual_seed(0))
    first = anchors.positions[0][anchors.valid[0]].tolist()
    assert len(set(first)) == 3 and set(first) <= {2, 3, 4, 7} and first == sorted(first)
    assert anchors.valid[1].sum() == 1 and anchors.positions[1][anchors.valid[1]].tolist() == [1]
    documents = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1]] * 2)  # a document starts at column 4
    assert not anchor_candidates(loss_mask, attention, documents)[0, 3]  # its next token is another document's


def test_position_weights_decay_and_stop_at_the_answer_and_document_end(model):
    cfg = DFlashConfig(block_size=4, gamma=2.0)
    draft = SPEC.build(cfg, DraftContext(_info(model)))
    ids = torch.randint(0, 250, (1, 10))
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0, 0, 0]])
    batch = DraftBatch(ids, loss_mask, torch.ones_like(ids))
    anchors = Anchors(positions=torch.tensor([[1, 4, 8]]), valid=torch.tensor([[True, True, False]]))
    tokens, positions, _, columns = block_inputs(draft, batch, anchors)
    assert tokens[0, 0] == ids[0, 1] and (tokens[0, 1:4] == draft.mask_token_id).all()
    assert positions[0].tolist() == [1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10, 11]
    weights, _ = position_weights(draft, batch, anchors, columns, cfg.gamma)
    decay = [0.0, 1.0, math.exp(-0.5), math.exp(-1.0)]
    assert weights[0, :4].tolist() == pytest.approx(decay)  # block at 1: positions 2, 3, 4 answer tokens
    assert weights[0, 4:8].tolist() == pytest.approx(decay[:3] + [0.0])  # block at 4: column 7 is no answer
    assert weights[0, 8:].tolist() == [0.0] * 4  # a filler block


def _batch(model, draft_cfg, length=24):
    ids = torch.randint(0, 250, (2, length), generator=torch.Generator().manual_seed(3))
    ones = torch.ones_like(ids)
    loss_mask = ones.clone()
    loss_mask[:, :5] = 0
    feats = capture_features(model, ids, ones, SPEC.feature_layers(draft_cfg, _info(model)))
    return DraftBatch(ids, loss_mask, ones, feats)


@pytest.mark.parametrize("vocab", [None, 200], ids=["target_head", "draft_vocab"])
def test_the_loss_trains_every_weight_and_falls(model, vocab):
    cfg = DFlashConfig(block_size=4, num_layers=2, num_anchors=12, draft_vocab_size=vocab)
    info = _info(model)
    draft = SPEC.build(cfg, DraftContext(info, torch.arange(info.vocab_size)))
    assert (draft.lm_head is None) == (vocab is None)
    batch = _batch(model, cfg)
    out = SPEC.loss(draft, batch, cfg)
    out.loss.backward()
    for name, param in draft.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert {f"acc@{k}" for k in (1, 2, 3)} <= set(out.metrics) and out.metrics["tau_sim"] >= 1.0
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = SPEC.loss(draft, batch, cfg).loss
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    with torch.no_grad():  # without gradients the blocks are drawn the same every call
        assert float(SPEC.loss(draft, batch, cfg).loss) == float(SPEC.loss(draft, batch, cfg).loss)


def test_activation_checkpointing_gives_the_same_loss_and_gradients(model, monkeypatch):
    from specdraft.methods.dflash import loss as loss_module

    monkeypatch.setattr(loss_module, "HEAD_CHUNK_ROWS", 7)  # several checkpointed head chunks
    cfg = DFlashConfig(block_size=4, num_layers=2, num_anchors=6)
    runs = []
    for mode in ("none", "swiglu", "full"):
        torch.manual_seed(0)
        draft = SPEC.build(cfg, DraftContext(_info(model), activation_checkpointing=mode))
        torch.manual_seed(1)
        loss = SPEC.loss(draft, _batch(model, cfg), cfg).loss
        loss.backward()
        runs.append((loss.detach(), {n: p.grad for n, p in draft.named_parameters()}))
    for loss, grads in runs[1:]:
        torch.testing.assert_close(loss, runs[0][0])
        for name, grad in runs[0][1].items():
            torch.testing.assert_close(grads[name], grad, msg=name)


def test_swiglu_checkpointing_keeps_only_gate_and_up_of_the_mlp(model):
    """swiglu (train's default) keeps the MLP's gate and up for the backward, not silu(gate) and its product."""
    cfg = DFlashConfig(block_size=4, num_layers=2, num_anchors=6)
    kept = {}
    for mode in ("none", "swiglu"):
        torch.manual_seed(0)
        draft = SPEC.build(cfg, DraftContext(_info(model), activation_checkpointing=mode))
        batch, width = _batch(model, cfg), draft.layers[0].mlp.gate_proj.out_features
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
            SPEC.loss(draft, batch, cfg).loss.backward()
        kept[mode] = sum(1 for shape in saved if len(shape) == 3 and shape[-1] == width)  # [B, Q, I] tensors
    assert kept["swiglu"] == 2 * cfg.num_layers < kept["none"], kept


@pytest.mark.parametrize("settings, key", [({"block_size": 1}, "method.block_size"),
                                           ({"block_size": 65}, "method.block_size"),
                                           ({"num_layers": 0}, "method.num_layers"),
                                           ({"mask_token_id": -3}, "method.mask_token_id"),
                                           ({"attention": "fast"}, "method.attention")])
def test_a_bad_setting_is_one_line_naming_its_key(settings, key):
    with pytest.raises(SpecdraftError, match=key) as err:
        DFlashConfig(**settings)
    assert "\n" not in str(err.value)


def test_a_mask_token_outside_the_vocabulary_is_refused(model):
    with pytest.raises(SpecdraftError, match=r"method.mask_token_id 320 is not an id of the target's vocabulary"):
        SPEC.build(DFlashConfig(mask_token_id=320), DraftContext(_info(model)))
    assert SPEC.build(DFlashConfig(), DraftContext(_info(model))).mask_token_id == 319  # the default: the last id


def test_the_hf_layout_needs_the_targets_head_and_both_layouts_name_the_same_layers(model):
    info = _info(model)
    with pytest.raises(SpecdraftError, match="--format speculators"):
        dflash_to_hf(SPEC.build(DFlashConfig(draft_vocab_size=100), DraftContext(info)), DFlashConfig(
            draft_vocab_size=100), info, {})
    cfg = DFlashConfig(block_size=8, num_layers=2, mask_token_id=300)
    draft = SPEC.build(cfg, DraftContext(info))
    hf, tensors = dflash_to_hf(draft, cfg, info, {})
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["num_hidden_layers"] == 2
    assert hf["dflash_config"] == {"block_size": 8, "mask_token_id": 300, "target_layer_ids": [0, 1],
                                   "num_target_layers": 4}
    assert "d2t" not in tensors and "lm_head.weight" not in tensors  # the target's own vocabulary and head
    speculators, _ = dflash_to_speculators(draft, cfg, info, {"target_hub_id": "org/tiny"})
    assert speculators["aux_hidden_state_layer_ids"] == draft.feature_layers == [1, 2]
    assert speculators["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    for config in (hf, speculators):  # read back as a checkpoint written elsewhere (no method_config)
        read = dflash_export_config({k: v for k, v in config.items() if k != "specdraft"})
        assert (read.block_size, read.num_layers, read.mask_token_id, read.feature_layers) == (8, 2, 300, [1, 2])


@torch.no_grad()
def test_a_draft_vocabulary_decodes_losslessly(model):
    """A trained head over 200 draft tokens (its d2t map into the target's ids) in the runtime: greedy output."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_llama_config(layers=4)).eval()
    target.lm_head.weight.mul_(20.0)
    info = _info(target)
    cfg = DFlashConfig(block_size=5, num_layers=1, draft_vocab_size=200, init_std=0.3)
    draft = SPEC.build(cfg, DraftContext(info, torch.randint(0, 100, (info.vocab_size,))))
    verifier = from_hf(target, info)
    prompt = torch.randint(0, 300, (11,)).tolist()
    expected = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=20, min_new_tokens=20,
                               eos_token_id=None, pad_token_id=0)[0, 11:].tolist()
    for shape in (TreeShape.chain(4), TreeShape(depth=4, topk=2, budget=7)):
        engine = SpecEngine(verifier, SPEC.runtime(draft, cfg, verifier), shape, 128, hf_rope_tables(target, 128))
        assert engine.generate(prompt, 20).tokens == expected


@pytest.mark.slow  # 400 sampled cycles a shape
@pytest.mark.parametrize("shape", [TreeShape.chain(5), TreeShape(depth=4, topk=3, budget=10)], ids=["chain", "tree"])
@torch.no_grad()
def test_dflash_cycles_at_t1_keep_the_targets_distribution(shape, monkeypatch):
    """The trained DFlash drafter through the engine's block cycle at T=1: each cycle's first token follows the
    target's distribution (chi-square over the top tokens), accepted draft or resampled."""
    from specdraft.decoding.cycles.block import BlockCycle
    from tests.runtime.sampled_cycles import first_tokens_from_prefix
    from tests.runtime.sampled_cycles import CRITICAL, chi_square_top
    from tests.runtime.drafts import PROMPT, trained_engine

    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")
    target, _, _, engine = trained_engine("dflash", shape)
    assert isinstance(engine.own_kind, BlockCycle)
    root, firsts = first_tokens_from_prefix(engine, PROMPT, 400)
    probs = torch.softmax(target(torch.tensor([PROMPT + [root]])).logits[0, -1], -1)  # [V]
    assert chi_square_top(firsts, probs) < CRITICAL
