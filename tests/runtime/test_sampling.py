"""Lossless sampling at T > 0: the first token a cycle emits, and the second given an accepted first, follow the
target's distribution exactly. A chi-square test on a 6-token vocabulary with a fixed seed; a broken acceptance
rule fails it."""
import torch

from specdraft.kernels.tree_select import select_tree
from specdraft.decoding import sampling
from specdraft.decoding.tree import DraftTree
from tests.kernels.trees import padded_expansion

VOCAB, TRIALS = 6, 3000


def _tree_and_logits():
    """Root 0 with children tokens 4, 1 (nodes 1, 2); node 1 has children 1, 3 (nodes 3, 4)."""
    tokens = torch.tensor([0, 4, 1, 1, 3])
    parents = torch.tensor([-1, 0, 0, 1, 1])
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(5, VOCAB, generator=generator) * 1.5
    mask = torch.eye(5, dtype=torch.bool)
    tree = DraftTree(tokens=tokens, parents=parents, depths=torch.tensor([0, 1, 1, 2, 2]),
                     valid=torch.ones(5, dtype=torch.bool), tree_mask=mask, joint_logprobs=torch.zeros(5))
    return tree, logits


def _emitted(tree, logits, nodes, length, bonus):
    path = [n for n in nodes.tolist() if n >= 0]
    return [int(tree.tokens[n]) for n in path[1:]] + [int(bonus)]


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected.clamp(min=1e-9)).sum())


def _sample_counts():
    tree, logits = _tree_and_logits()
    generator = torch.Generator().manual_seed(0)
    first = torch.zeros(VOCAB)
    second_after_node1 = torch.zeros(VOCAB)
    for _ in range(TRIALS):
        uniforms = sampling.draw_uniforms(tree.tokens.shape[0], generator, torch.device("cpu"))
        out = _emitted(tree, logits, *sampling.verify_sampling(logits, tree, 2, 1.0, uniforms))
        first[out[0]] += 1
        if len(out) > 1 and out[0] == 4:  # node 1 accepted: the next token is drawn at node 1
            second_after_node1[out[1]] += 1
    return logits, first, second_after_node1


# chi-square critical value, 5 degrees of freedom, p = 0.001
CRITICAL = 20.5


def test_emitted_tokens_follow_the_target_distribution():
    logits, first, second = _sample_counts()
    assert _chi_square(first, torch.softmax(logits[0], -1)) < CRITICAL
    assert _chi_square(second, torch.softmax(logits[1], -1)) < CRITICAL


def test_a_broken_acceptance_rule_is_caught(monkeypatch):
    def forgets_rejected(probs, tokens, rejected):  # the bonus may resample a rejected child
        return probs

    monkeypatch.setattr(sampling, "_ban_rejected", forgets_rejected)
    logits, first, _ = _sample_counts()
    assert _chi_square(first, torch.softmax(logits[0], -1)) > CRITICAL


def test_a_walk_that_forgets_earlier_rejections_is_caught(monkeypatch):
    monkeypatch.setattr(sampling, "_remaining_mass", torch.ones_like)  # later children accepted too rarely
    logits, first, _ = _sample_counts()
    assert _chi_square(first, torch.softmax(logits[0], -1)) > CRITICAL


def test_temperature_zero_sampling_is_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2]])
    assert int(sampling.sample_token(logits, 0.0)) == 1


def test_padding_under_no_node_is_never_accepted_nor_banned():
    """Node 2 is padding (parent -1, as `select_tree` leaves it): the walk never accepts it, and when node 1 is
    rejected the bonus may still be node 2's token (only rejected children are banned)."""
    tree, logits = _tree_and_logits()
    tree.parents = torch.tensor([-1, 0, -1, 1, 1])
    tree.valid = torch.tensor([True, True, False, True, True])
    logits[0] = torch.tensor([0.0, 4.0, 0.0, 0.0, -9.0, 0.0])  # the target prefers token 1, node 2's
    generator = torch.Generator().manual_seed(1)
    bonus_tokens = set()
    for _ in range(200):
        uniforms = sampling.draw_uniforms(5, generator, torch.device("cpu"))
        nodes, length, bonus = sampling.verify_sampling(logits, tree, 2, 1.0, uniforms)
        assert 2 not in nodes.tolist()
        if int(length) == 0:
            bonus_tokens.add(int(bonus))
    assert 1 in bonus_tokens


def test_selected_padding_is_never_accepted():
    """select_tree's padding (a kept candidate whose parent was not kept) carries the token the target all but
    surely samples at the root, and no real child of the root does: the walk never accepts it. Hung under the root
    instead, it would be (its draft probability is 0)."""
    tokens, parents, scores = padded_expansion(vocab=VOCAB)
    selection = select_tree(tokens, parents, scores, 8, 3)
    tree = DraftTree(tokens=selection.tokens, parents=selection.parents, depths=selection.depths,
                     valid=selection.valid, tree_mask=selection.tree_mask, joint_logprobs=selection.joint_logprobs)
    target_logits = torch.zeros(8, VOCAB)  # [N, V]
    target_logits[0, tokens[5]] = 20.0
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        uniforms = sampling.draw_uniforms(8, generator, torch.device("cpu"))
        nodes, length, bonus = sampling.verify_sampling(target_logits, tree, 3, 1.0, uniforms)
        assert 5 not in nodes.tolist() and int(length) == 0 and int(bonus) == tokens[5]
