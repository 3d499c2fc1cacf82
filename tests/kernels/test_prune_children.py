"""prune_children: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against its reference (bf16 and float32
logits, k and the hidden width off powers of two, a parent scored -inf), and the reference against its parts:
the entropy `top_entropy` computes and the FFN over `ffn_features` (what C2T's traces record and training reads)."""
import pytest
import torch

from specdraft.kernels.prune_children import (EXTENDED_FEATURES, PAPER_FEATURES, ScorerWeights, child_inputs,
                                              ffn_features, ffn_logits, prune_children_reference)
from specdraft.kernels.prune_children.triton_kernel import prune_children_triton
from specdraft.kernels.top_entropy import top_entropy_reference


def _inputs(parents: int, k: int, vocab: int, dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    parent_logits = (torch.randn(parents, vocab, generator=generator) * 3).to(dtype)
    child_logprobs = torch.log_softmax(parent_logits.float(), -1).topk(k, -1).values  # [p, k]
    parent_scores = -torch.rand(parents, generator=generator) * 2  # [p]
    return child_logprobs, parent_scores, parent_logits


def _weights(hidden: int, cut: float, seed: int = 1, features: int = PAPER_FEATURES) -> ScorerWeights:
    generator = torch.Generator().manual_seed(seed)
    return ScorerWeights(hidden_weight=torch.randn(hidden, features, generator=generator),
                         hidden_bias=torch.randn(hidden, generator=generator),
                         out_weight=torch.randn(hidden, generator=generator) / hidden ** 0.5,
                         out_bias=torch.randn(1, generator=generator), cut=torch.tensor([cut]))


def _logits(child_logprobs, parent_scores, parent_logits, depth, weights, top):
    joint, entropy = child_inputs(child_logprobs, parent_scores, parent_logits, top)
    extended = () if weights.hidden_weight.shape[1] == PAPER_FEATURES else (
        child_logprobs, parent_scores[:, None], torch.arange(joint.shape[1])[None, :])
    return ffn_logits(ffn_features(joint, entropy[:, None], torch.full_like(joint, depth), *extended), weights)


@pytest.mark.parametrize("parents, k, vocab, hidden, dtype, depth, features", [
    (8, 8, 700, 48, torch.bfloat16, 3, PAPER_FEATURES), (1, 8, 700, 48, torch.bfloat16, 1, PAPER_FEATURES),
    (3, 5, 300, 20, torch.float32, 2, PAPER_FEATURES), (10, 10, 1500, 48, torch.float16, 7, PAPER_FEATURES),
    (8, 8, 700, 48, torch.bfloat16, 3, EXTENDED_FEATURES), (3, 5, 300, 20, torch.float32, 1, EXTENDED_FEATURES)])
def test_triton_matches_reference(parents, k, vocab, hidden, dtype, depth, features):
    inputs = _inputs(parents, k, vocab, dtype)
    if parents > 1:
        inputs[1][-1] = -float("inf")  # a parent that was itself dropped (a joint probability of 0)
    logits = _logits(*inputs, depth, _weights(hidden, 0.0, features=features), 100)
    cut = logits[torch.isfinite(logits)].median().item()  # about half kept
    weights = _weights(hidden, cut, features=features)
    expected = prune_children_reference(*inputs, depth, weights, 100)
    got = prune_children_triton(*inputs, depth, weights, 100)
    clear = (logits - cut).abs() > 1e-4  # rounding may move a logit at the cut to either side
    assert got.dtype == expected.dtype == torch.float32 and got.shape == expected.shape
    assert torch.equal(got[clear], expected[clear])
    assert (expected == -float("inf")).any() and (expected > -float("inf")).any()


def test_reference_keeps_children_scored_at_or_over_the_cut():
    child_logprobs, parent_scores, parent_logits = _inputs(4, 6, 200, torch.float32, seed=3)
    weights = _weights(16, 0.0)
    logits = _logits(child_logprobs, parent_scores, parent_logits, 2, weights, 50)
    got = prune_children_reference(child_logprobs, parent_scores, parent_logits, 2, weights._replace(
        cut=torch.tensor([logits.median().item()])), 50)
    kept = logits >= logits.median()
    assert torch.equal(got > -float("inf"), kept) and torch.equal(got[kept], child_logprobs[kept])
    joint, entropy = child_inputs(child_logprobs, parent_scores, parent_logits, 50)
    torch.testing.assert_close(joint, parent_scores[:, None] + child_logprobs)
    torch.testing.assert_close(entropy, top_entropy_reference(parent_logits, 50))
    features = ffn_features(joint, entropy[:, None], torch.full_like(joint, 2))
    assert torch.equal(features[..., 0], joint.exp()) and (features[..., 2] == 2).all()


def test_extended_features_add_own_and_parent_probabilities_and_rank():
    joint, own, parent = torch.tensor([-1.0, -2.0]), torch.tensor([-0.5, -1.5]), torch.tensor([-0.5, -0.5])
    features = ffn_features(joint, torch.tensor(0.7), torch.tensor(2), own, parent, torch.tensor([0, 1]))
    assert features.shape == (2, EXTENDED_FEATURES)
    torch.testing.assert_close(features[:, :3], ffn_features(joint, torch.tensor(0.7), torch.tensor(2)))
    torch.testing.assert_close(features[:, 3:], torch.stack([own.exp(), parent.exp(), torch.tensor([0.0, 1.0])], 1))
