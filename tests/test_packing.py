"""Sequence packing: several conversations per row with per-document positions and attention give the same
EAGLE-3 loss, gradients and metrics as one conversation per row; flex attention and activation checkpointing
give the same loss as the dense path. CPU, tiny target."""
import warnings

import pytest
import torch

from specdraft.config import DataConfig, TargetConfig
from specdraft.core.errors import SpecdraftError
from specdraft.methods import get_method
from specdraft.core.types import DraftBatch, DraftContext
from specdraft.targets import capture_features, load_target
from specdraft.train.data import collate, collate_packed, pack_rows
from tests.distilled import PACKED_LENGTHS, random_conversation_rows

SPEC = get_method("eagle3")
LENGTHS = PACKED_LENGTHS


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(TargetConfig(path=str(tiny_target_dir)))


def _setup(target, batch):
    """-> a seeded draft, its config and the batch with the target's features."""
    cfg = SPEC.config(ttt_steps=3, draft_vocab_size=300)
    torch.manual_seed(0)
    draft = SPEC.build(cfg, DraftContext(target.info, torch.arange(target.info.vocab_size)))
    features = capture_features(target.model, batch["input_ids"], batch["attention_mask"],
                                SPEC.feature_layers(cfg, target.info), position_ids=batch.get("position_ids"))
    draft_batch = DraftBatch(batch["input_ids"], batch["loss_mask"], batch["attention_mask"], features,
                             position_ids=batch.get("position_ids"), document_ids=batch.get("document_ids"))
    return draft, cfg, draft_batch


def _run(target, batch, checkpointing=False):
    draft, cfg, draft_batch = _setup(target, batch)
    draft.activation_checkpointing = checkpointing
    out = SPEC.loss(draft, draft_batch, cfg)
    out.loss.backward()
    return out, {name: p.grad for name, p in draft.named_parameters()}


def test_pack_rows_first_fit_decreasing():
    assert pack_rows([9, 14, 6, 11], 20) == [[1, 2], [0, 3]]  # 14 + 6 and 11 + 9
    assert pack_rows([9, 14, 6, 11], 16) == [[1], [3], [0, 2]]
    assert pack_rows([5], 5) == [[0]]


def test_collate_packed_positions_documents_and_padding():
    batch = collate_packed(random_conversation_rows(), max_length=16, pack_length=24)
    assert batch["input_ids"].shape == (2, 24)
    assert batch["attention_mask"].sum() == sum(LENGTHS)
    for row in range(2):
        documents = batch["document_ids"][row]
        assert torch.all(documents[1:] >= documents[:-1])
        starts = torch.nonzero(torch.diff(documents, prepend=documents[:1] - 1)).flatten()
        assert torch.all(batch["position_ids"][row, starts] == 0)
        padding = batch["attention_mask"][row] == 0
        assert torch.all(documents[padding] == documents.max())


def test_packed_and_unpacked_give_the_same_loss_gradients_and_metrics(target):
    rows = random_conversation_rows()
    unpacked, unpacked_grads = _run(target, collate(rows, max_length=16))
    packed_batch = collate_packed(rows, max_length=16, pack_length=24)
    assert packed_batch["input_ids"].shape[0] < len(rows)
    packed, packed_grads = _run(target, packed_batch)
    assert float(unpacked.loss.detach()) > 0
    torch.testing.assert_close(packed.loss, unpacked.loss, rtol=1e-5, atol=1e-6)
    for name in ("acc@1", "acc@3", "tau_sim"):
        torch.testing.assert_close(packed.metrics[name], unpacked.metrics[name])
    for name, grad in unpacked_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_flex_attention_gives_the_dense_loss_on_packed_rows(target):
    batch = collate_packed(random_conversation_rows(), max_length=16, pack_length=24)
    draft, cfg, draft_batch = _setup(target, batch)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        dense = SPEC.loss(draft, draft_batch, cfg).loss
        cfg.attention = "flex"
        flex = SPEC.loss(draft, draft_batch, cfg).loss
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("checkpointing", ["swiglu", "selective", "full", True])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(target, checkpointing):
    batch = collate_packed(random_conversation_rows(), max_length=16, pack_length=24)
    plain, plain_grads = _run(target, batch)
    recomputed, recomputed_grads = _run(target, batch, checkpointing=checkpointing)
    torch.testing.assert_close(recomputed.loss, plain.loss)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(recomputed_grads[name], grad, msg=name)


def test_pack_length_shorter_than_max_length_is_an_error():
    with pytest.raises(SpecdraftError, match="data.pack_length"):
        DataConfig(max_length=512, pack_length=256)


def test_training_on_packed_rows_with_checkpointing(tmp_path, tiny_target_dir, distilled, monkeypatch):
    """`train` with data.pack_length and train.activation_checkpointing: packed batches reach the draft."""
    from specdraft.recipes import load_recipe
    from specdraft.train.module import DraftModule
    from specdraft.train.trainer import run_train
    from tests.test_train_export_eval import make_recipe

    seen, draft_batch = [], DraftModule._draft_batch

    def recording(module, batch, features=None):
        seen.append((tuple(batch["input_ids"].shape), int(batch["document_ids"].max())))
        assert module.draft.activation_checkpointing
        return draft_batch(module, batch, features)

    monkeypatch.setattr(DraftModule, "_draft_batch", recording)
    recipe_path = make_recipe(tmp_path, tiny_target_dir, distilled, max_steps=2, val_every_steps=2,
                              activation_checkpointing="true")
    recipe = load_recipe(recipe_path, ["data.max_length=64", "data.pack_length=128"])
    summary = run_train(recipe)
    assert summary["steps"] == 2 and summary["tokens"] == 2 * 4 * 32  # every conversation's tokens, no padding
    assert summary["best"] >= 1.0
    assert seen[0] == ((1, 128), 3)  # four 32-token conversations (documents 0..3), no padding document


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_cuda_fast_paths_give_the_reference_loss_and_gradients(target, monkeypatch, packed):
    """On CUDA: flex attention (compiled) and the Triton soft cross-entropy against the dense reference path."""
    rows = random_conversation_rows()
    batch = collate_packed(rows, max_length=16, pack_length=24) if packed else collate(rows, max_length=16)
    target.model.to("cuda")
    batch = {k: v.cuda() for k, v in batch.items()}
    results = []
    for kernels in ("reference", "auto"):
        monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
        draft, cfg, draft_batch = _setup(target, batch)
        draft.cuda()
        out = SPEC.loss(draft, draft_batch, cfg)
        out.loss.backward()
        results.append((out.loss.detach(), {n: p.grad for n, p in draft.named_parameters()}))
    target.model.to("cpu")
    (ref_loss, ref_grads), (fast_loss, fast_grads) = results
    torch.testing.assert_close(fast_loss, ref_loss, rtol=1e-3, atol=1e-4)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=5e-3, atol=1e-4, msg=name)
