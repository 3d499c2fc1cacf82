"""select_tree: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against its reference on expansions of
runtime shapes, ties included, and the reference against tree.py's selection as it was written before the fusion
(torch.topk, then the tree built from the kept candidates)."""
import pytest
import torch

from specdraft.kernels.tree_select import ancestry, select_tree, select_tree_reference
from specdraft.kernels.tree_select.triton_kernel import select_tree_triton
from specdraft.kernels.tree_verify import verify_greedy
from tests.kernels.trees import ancestor_mask, expansion_candidates, padded_expansion


def _assert_same(got, expected):
    for name, a, b in zip(expected._fields, got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name


@pytest.mark.parametrize("depth, topk, budget", [(6, 8, 48), (5, 8, 32), (3, 2, 6), (1, 4, 3), (4, 1, 5),
                                                 (6, 10, 60), (2, 3, 13)])
def test_triton_matches_reference(depth, topk, budget):
    for seed in range(3):
        candidates = expansion_candidates(depth, topk, torch.Generator().manual_seed(seed))
        _assert_same(select_tree_triton(*candidates, budget, depth), select_tree_reference(*candidates, budget, depth))


def test_ties_keep_the_lower_candidate_and_pad_orphans():
    """Every candidate ties: the first budget - 1 after the root are kept, and a kept candidate whose parent was not
    (it lies past the budget) becomes padding in both: under no node, its mask row itself alone, scored -inf."""
    tokens, parents, scores = padded_expansion()  # candidate 5 hangs under candidate 9, which 8 nodes leave out
    got = select_tree_triton(tokens, parents, scores, 8, 3)
    _assert_same(got, select_tree_reference(tokens, parents, scores, 8, 3))
    assert got.chosen.tolist() == list(range(8))
    assert got.valid.tolist() == [True] * 5 + [False] + [True] * 2
    assert got.parents[5] == -1 and got.depths[5] == 1 and got.joint_logprobs[5] == -float("inf")
    assert got.tree_mask[5].tolist() == [False] * 5 + [True] + [False] * 2


def test_reference_keeps_what_topk_kept():
    """Without ties the reference keeps the root and torch.topk's budget - 1 best, with every node's ancestors in
    its mask row and its depth."""
    tokens, parents, scores = expansion_candidates(6, 8, torch.Generator().manual_seed(5))
    got = select_tree(tokens, parents, scores, 48, 6)
    ranked = torch.where(torch.arange(scores.shape[0]) == 0, float("inf"), scores)
    assert torch.equal(got.chosen, torch.sort(torch.topk(ranked, 48).indices).values)
    assert got.valid.all() and torch.equal(got.tokens, tokens[got.chosen])
    node_parents = got.parents.clone()
    assert torch.equal(got.tree_mask, ancestor_mask(node_parents))
    assert torch.equal(got.depths, ancestor_mask(node_parents).sum(1) - 1)
    assert torch.equal(ancestry(node_parents, 6), got.tree_mask)


def test_selected_padding_is_never_accepted_by_the_verify():
    """select_tree and verify_greedy together (each dispatched as the runtime does): the padding the selection leaves
    carries the root's argmax, and no real child of the root does, so the verify accepts nothing and the bonus is
    the argmax. Hung under the root instead, the padding would be accepted."""
    tokens, parents, scores = padded_expansion(vocab=40)
    tree = select_tree(tokens, parents, scores, 8, 3)
    target_logits = torch.randn(8, 40, generator=torch.Generator().manual_seed(5))  # [N, V]
    target_logits[0, tokens[5]] = 100.0
    accepted, accept_length, bonus = verify_greedy(target_logits, tree.tokens, tree.parents, 3)
    assert tree.tokens[5] == tokens[5] and not tree.valid[5]
    assert accepted.tolist() == [0, -1, -1, -1] and accept_length.item() == 0 and bonus.item() == tokens[5]


def test_candidates_a_scorer_dropped_are_padding():
    """Candidates scored -inf (a tree scorer dropped them, and their descendants with them) taken because fewer
    than the budget were kept: padding in both, like a tie's orphan; the kept ones are the tree they were."""
    tokens, parents, scores = expansion_candidates(4, 4, torch.Generator().manual_seed(3))
    dropped = scores.clone()
    dropped[1] = dropped[parents == 1] = -float("inf")  # depth 1's first child and its children
    keep_all = dropped > -float("inf")
    dropped[(torch.arange(scores.shape[0]) > 8) & keep_all] = -float("inf")  # 7 real candidates left
    got = select_tree_triton(tokens, parents, dropped, 12, 4)
    _assert_same(got, select_tree_reference(tokens, parents, dropped, 12, 4))
    real = dropped[got.chosen] > -float("inf")
    assert torch.equal(got.valid, real) and got.valid.sum() == 8  # the root and 7
    assert (got.parents[~real] == -1).all() and (got.depths[~real] == 1).all()
    assert torch.equal(got.tree_mask[~real], torch.eye(12, dtype=torch.bool)[~real])
    assert not got.tree_mask[real][:, ~real].any()  # no real node sees a dropped one


def test_nan_scores_never_take_the_roots_place():
    """Candidates scored NaN (a broken draft or scorer) rank as -inf in both: the root stays node 0 with its token,
    and a NaN candidate the budget takes is padding."""
    tokens, parents, scores = expansion_candidates(3, 3, torch.Generator().manual_seed(2))
    scores = scores.clone()
    scores[1:] = float("nan")  # every candidate but the root
    got = select_tree_triton(tokens, parents, scores, 6, 3)
    _assert_same(got, select_tree_reference(tokens, parents, scores, 6, 3))
    assert got.chosen[0] == 0 and got.tokens[0] == tokens[0] and got.valid.tolist() == [True] + [False] * 5
    assert (got.parents == -1).all() and torch.equal(got.tree_mask, torch.eye(6, dtype=torch.bool))
    scores[1:4] = torch.tensor([-0.1, -0.2, -0.3])  # depth 1 real again, its descendants NaN
    got = select_tree_triton(tokens, parents, scores, 6, 3)
    _assert_same(got, select_tree_reference(tokens, parents, scores, 6, 3))
    assert got.chosen[:4].tolist() == [0, 1, 2, 3] and got.valid.tolist() == [True] * 4 + [False] * 2
