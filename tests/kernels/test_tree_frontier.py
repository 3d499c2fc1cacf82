"""advance_frontier: the Triton kernel (under TRITON_INTERPRET=1 on CPU) against its reference, ties included,
and the reference against tree.py's expansion as it was written before the fusion (torch.topk and gathers)."""
import pytest
import torch

from specdraft.kernels.tree_frontier import advance_frontier, advance_frontier_reference
from specdraft.kernels.tree_frontier.triton_kernel import advance_frontier_triton


def _inputs(k, children, width, mask_width, dtype=torch.bfloat16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    child_logprobs = -torch.rand(k, children, generator=generator).sort(dim=1, descending=False).values * 5
    child_tokens = torch.randint(0, 49152, (k, children), generator=generator)
    frontier_scores = -torch.rand(k, generator=generator) * 3
    frontier_ids = torch.randint(1, 200, (k,), generator=generator)
    hidden = torch.randn(k, width, generator=generator).to(dtype)
    visible = torch.rand(k, mask_width, generator=generator) > 0.5
    return child_logprobs, child_tokens, frontier_scores, frontier_ids, hidden, visible


def _assert_same(got, expected):
    for name, a, b in zip(expected._fields, got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name


@pytest.mark.parametrize("k, children, width, mask_width", [(8, 8, 576, 49), (1, 1, 64, 2), (4, 6, 100, 25),
                                                            (10, 10, 96, 61)])
def test_triton_matches_reference(k, children, width, mask_width):
    scores, tokens, frontier_scores, ids, hidden, visible = _inputs(k, children, width, mask_width)
    args = (scores, tokens, frontier_scores, ids, 17, hidden, visible)
    _assert_same(advance_frontier_triton(*args), advance_frontier_reference(*args))


@pytest.mark.parametrize("k, mask_width, own_slot_base", [(8, 49, 17), (4, 25, 21), (1, 2, 1)])
def test_the_next_nodes_own_slots(k, mask_width, own_slot_base):
    """With own_slot_base, node j of the next frontier sees its parent's slots and slot own_slot_base + j: the
    kernel as the reference, and the reference as the or that runtime/tree.py did after it."""
    scores, tokens, frontier_scores, ids, hidden, visible = _inputs(k, k, 64, mask_width)
    visible[:, own_slot_base:own_slot_base + k] = False  # the next depth's slots: nobody's yet
    args = (scores, tokens, frontier_scores, ids, 3, hidden, visible, own_slot_base)
    got, expected = advance_frontier_triton(*args), advance_frontier_reference(*args)
    _assert_same(got, expected)
    own = torch.arange(mask_width) == own_slot_base + torch.arange(k)[:, None]  # [k, W]
    assert torch.equal(expected.visible, advance_frontier_reference(*args[:-1]).visible | own)


def test_ties_and_dead_branches_keep_the_lower_child_first():
    scores, tokens, frontier_scores, ids, hidden, visible = _inputs(4, 4, 32, 9, torch.float32, seed=1)
    scores[:] = -1.0
    frontier_scores[:] = -2.0  # every child ties
    scores[2, 1:] = -float("inf")  # a node whose other children the draft ruled out
    args = (scores, tokens, frontier_scores, ids, 5, hidden, visible)
    got = advance_frontier_triton(*args)
    _assert_same(got, advance_frontier_reference(*args))
    assert got.best.tolist() == [0, 1, 2, 3]


def test_reference_keeps_the_frontier_tree_py_kept():
    """Without ties, the reference picks the children torch.topk picked, with their tokens, ids and rows."""
    scores, tokens, frontier_scores, ids, hidden, visible = _inputs(8, 8, 64, 17, torch.float32, seed=2)
    joint = (frontier_scores[:, None] + scores).flatten()
    top_scores, best = torch.topk(joint, 8)
    got = advance_frontier(scores, tokens, frontier_scores, ids, 9, hidden, visible)
    assert torch.equal(got.scores, top_scores) and torch.equal(got.best, best)
    assert torch.equal(got.tokens, tokens.flatten()[best]) and torch.equal(got.ids, 9 + best)
    assert torch.equal(got.hidden, hidden[best // 8]) and torch.equal(got.visible, visible[best // 8])
    assert torch.equal(got.parents, ids.repeat_interleave(8)) and torch.equal(got.joint, joint)
