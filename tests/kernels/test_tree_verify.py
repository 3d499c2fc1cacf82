"""verify_greedy: the Triton kernels (under TRITON_INTERPRET=1 on CPU) against the reference, and the reference
against a plain walk down the tree. Several vocabulary chunks are forced with small `block_v`."""
import pytest
import torch

from specdraft.kernels.tree_verify import verify_greedy, verify_greedy_reference
from specdraft.kernels.tree_verify.triton_kernel import verify_greedy_triton
from tests.kernels.trees import depth, random_parents


def _walk(target_logits, tree_tokens, parents, depth_limit):
    """The definition, one node at a time: -> (path list, bonus token)."""
    argmax = [int(row.float().argmax()) for row in target_logits]
    path = [0]
    while len(path) <= depth_limit:
        children = [i for i in range(1, len(parents)) if int(parents[i]) == path[-1]
                    and int(tree_tokens[i]) == argmax[path[-1]]]
        if not children:
            break
        path.append(min(children))
    return path, argmax[path[-1]]


def _check(target_logits, tree_tokens, parents, depth_limit, block_v=None):
    """Triton == reference == the plain walk; returns the accepted length."""
    got = verify_greedy_triton(target_logits, tree_tokens, parents, depth_limit, block_v=block_v)
    expected = verify_greedy_reference(target_logits, tree_tokens, parents, depth_limit)
    for got_tensor, expected_tensor in zip(got, expected):
        assert got_tensor.dtype == torch.int64 and torch.equal(got_tensor, expected_tensor)
    path, bonus = _walk(target_logits, tree_tokens, parents, depth_limit)
    assert expected[0].tolist() == path + [-1] * (depth_limit + 1 - len(path))
    assert expected[1].tolist() == [len(path) - 1] and expected[2].tolist() == [bonus]
    return int(expected[1])


def _tree(num_nodes, vocab, dtype, seed, match_fraction=0.7):
    """Random logits and tree whose tokens match the parent's argmax with probability `match_fraction`."""
    generator = torch.Generator().manual_seed(seed)
    target_logits = (torch.randn(num_nodes, vocab, generator=generator) * 3).to(dtype)
    parents = random_parents(num_nodes, generator)
    argmax = target_logits.float().argmax(-1)
    tree_tokens = torch.randint(0, vocab, (num_nodes,), generator=generator)
    hits = torch.rand(num_nodes, generator=generator) < match_fraction
    tree_tokens = torch.where(hits, argmax[parents.clamp(min=0)], tree_tokens)
    tree_tokens[0] = 7
    return target_logits, tree_tokens, parents


@pytest.mark.parametrize("num_nodes, vocab, dtype, block_v", [
    (1, 50, torch.float32, None), (6, 100, torch.float32, 16), (20, 300, torch.bfloat16, 64),
    (33, 200, torch.float16, None), (12, 90, torch.float32, 32)])
def test_random_trees_match_reference(num_nodes, vocab, dtype, block_v):
    target_logits, tree_tokens, parents = _tree(num_nodes, vocab, dtype, seed=num_nodes)
    for depth_limit in sorted({1, depth(parents) + 1}):
        _check(target_logits, tree_tokens, parents, depth_limit, block_v)


def test_accept_nothing_and_accept_full_depth():
    target_logits, _, _ = _tree(5, 64, torch.float32, 0)
    chain = torch.tensor([-1, 0, 1, 2, 3])
    argmax = target_logits.argmax(-1)
    assert _check(target_logits, argmax[chain.clamp(min=0)] + 1, chain, 4, block_v=16) == 0
    full = argmax[chain.clamp(min=0)]
    assert _check(target_logits, full, chain, 4, block_v=16) == 4
    assert _check(target_logits, full, chain, 2, block_v=16) == 2  # the depth limit cuts the path


def test_duplicate_siblings_take_the_lowest_index():
    """Nodes 1 and 2 both carry the root's argmax; only node 2 has a matching child. The lowest index wins."""
    target_logits = torch.randn(4, 40)
    argmax = target_logits.argmax(-1)
    parents = torch.tensor([-1, 0, 0, 2])
    tree_tokens = torch.stack([argmax[0], argmax[0], argmax[0], argmax[2]])
    accepted = verify_greedy_triton(target_logits, tree_tokens, parents, 3)[0]
    assert accepted.tolist() == [0, 1, -1, -1]
    _check(target_logits, tree_tokens, parents, 3)


def test_argmax_ties_take_the_lowest_id_across_chunks():
    target_logits = torch.zeros(3, 96)
    target_logits[0, [5, 40, 80]] = 2.0  # tie in three chunks of 32
    target_logits[1, [33, 34]] = 1.0
    target_logits[2] = -float("inf")  # no finite logit: argmax is id 0
    parents = torch.tensor([-1, 0, 1])
    assert _check(target_logits, torch.tensor([9, 5, 33]), parents, 2, block_v=32) == 2
    assert verify_greedy_triton(target_logits, torch.tensor([9, 40, 33]), parents, 2, block_v=32)[1].item() == 0
    assert verify_greedy(target_logits, torch.tensor([9, 5, 34]), parents, 2)[2].tolist() == [33]


def test_padding_under_no_node_is_never_accepted():
    """`select_tree` hangs padding under no node (parent -1): node 1 carries the root's argmax but is padding, so
    the path goes through node 2, the lowest matching child of the root."""
    target_logits = torch.randn(4, 40)
    argmax = target_logits.argmax(-1)
    parents = torch.tensor([-1, -1, 0, 2])
    tree_tokens = torch.stack([argmax[0], argmax[0], argmax[0], argmax[2]])
    assert verify_greedy_triton(target_logits, tree_tokens, parents, 3)[0].tolist() == [0, 2, 3, -1]
    assert _check(target_logits, tree_tokens, parents, 3) == 2
