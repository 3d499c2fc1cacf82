"""Retrieval drafts (specdraft/decoding/policies/suffix_automaton.py, cycles/retrieval.py): the suffix automaton
against brute force on random strings (what it accepts, the longest earlier match of the text's newest suffix, where
it first ended, the continuation drafted from it), the corpus beside the text, and the graft of a retrieved chain
onto a tree."""
import random

import pytest
import torch

from specdraft.decoding.cycles.retrieval import graft_chain
from specdraft.decoding.policies.suffix_automaton import SEPARATOR, Match, Retrieval, SuffixAutomaton, corpus_automaton
from specdraft.decoding.tree import DraftTree


def _occurs(text, pattern):
    size = len(pattern)
    return any(text[start:start + size] == pattern for start in range(len(text) - size + 1))


def _accepts(automaton, pattern):
    state = 0
    for token in pattern:
        state = automaton.next[state].get(token)
        if state is None:
            return False
    return True


def _earlier_match(text, end):
    """The longest suffix of text[:end + 1] that occurs in text[:end] -> its length."""
    return max(size for size in range(end + 1) if _occurs(text[:end], text[end + 1 - size:end + 1]))


def _first_end(text, end, size):
    """The end index of the first occurrence of the suffix of `size` tokens of text[:end + 1]."""
    pattern = text[end + 1 - size:end + 1]
    return next(stop for stop in range(size - 1, end + 1) if text[stop + 1 - size:stop + 1] == pattern)


def _brute_continuation(text, end, length, count, min_length):
    """The draft: the longest match of at least min_length whose first occurrence leaves `count` tokens after
    it, else the min_length one."""
    chosen = min_length
    for size in range(length, min_length - 1, -1):
        if end - _first_end(text, end, size) >= count:
            chosen = size
            break
    start = _first_end(text, end, chosen) + 1
    return text[start:min(start + count, end + 1)]


@pytest.mark.parametrize("alphabet,length,seed", [(2, 120, 0), (3, 150, 1), (4, 200, 2), (9, 200, 3)])
def test_the_automaton_accepts_exactly_the_substrings(alphabet, length, seed):
    rng = random.Random(seed)
    text = [rng.randrange(alphabet) for _ in range(length)]
    automaton = SuffixAutomaton(text)
    for _ in range(400):
        start = rng.randrange(length)
        pattern = text[start:start + rng.randrange(1, 12)]
        assert _accepts(automaton, pattern)
        mutated = pattern[:-1] + [rng.randrange(alphabet + 1)]
        assert _accepts(automaton, mutated) == _occurs(text, mutated)
    assert len(automaton.length) <= 2 * length  # at most 2n - 1 states


@pytest.mark.parametrize("alphabet,length,seed", [(2, 90, 0), (3, 120, 1), (5, 150, 2)])
def test_the_match_and_its_draft_equal_brute_force(alphabet, length, seed):
    rng = random.Random(seed)
    text = [rng.randrange(alphabet) for _ in range(length)]
    automaton = SuffixAutomaton()
    match = Match(automaton)
    for end, token in enumerate(text):
        match.feed(token)  # against the text before it
        automaton.add(token)
        match.settle()
        expected = _earlier_match(text, end)
        assert match.length == expected, end
        if expected:
            assert automaton.first_end[match.state] == _first_end(text, end, expected)
            for count, min_length in ((4, 1), (6, min(2, expected))):
                assert match.continuation(count, min_length) == \
                    _brute_continuation(text, end, expected, count, min_length)


def test_a_repeating_text_drafts_a_whole_period_ahead():
    retrieval = Retrieval(draft_len=6, min_match=3)
    retrieval.reset([7, 1, 2, 3] * 3)  # the longest match (7 tokens) leaves 4 after it; "1 2 3" leaves 8
    assert retrieval.draft() == [7, 1, 2, 3, 7, 1]
    retrieval.extend([7, 1])
    assert retrieval.draft() == [2, 3, 7, 1, 2, 3]
    retrieval.extend([9])  # a token never seen: no match
    assert retrieval.draft() == []


def test_the_corpus_is_retrieved_from_when_its_match_is_longer_by_the_bias():
    corpus = corpus_automaton([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [40, 41, 42]])
    retrieval = Retrieval(draft_len=3, min_match=2, corpus=corpus)
    retrieval.reset([1, 5, 6, 7])  # 3 tokens of the corpus: discounted below the minimum
    assert retrieval.draft() == []
    retrieval.extend([8, 9, 10])  # 6 tokens: 2 after the discount
    assert retrieval.draft() == [11, 12, 13]
    retrieval.reset([13, 14, 40, 41, 42, 40, 41])  # no match crosses a document's end; the text's own wins
    assert SEPARATOR not in retrieval.draft() and retrieval.draft() == [42, 40, 41]


def _small_tree():
    """Root 0 (token 1) with children 1 (token 2), 2 (token 3); node 1 with child 3 (token 4); node 4 padding."""
    parents = torch.tensor([-1, 0, 0, 1, -1])
    mask = torch.eye(5, dtype=torch.bool)
    for node, ancestors in ((1, [0]), (2, [0]), (3, [0, 1])):
        mask[node, ancestors] = True
    return DraftTree(tokens=torch.tensor([1, 2, 3, 4, 2]), parents=parents, depths=torch.tensor([0, 1, 1, 2, 1]),
                     valid=torch.tensor([True, True, True, True, False]), tree_mask=mask,
                     joint_logprobs=torch.zeros(5))


@pytest.mark.parametrize("chain,graft_at,held", [([2, 4, 9, 8], 3, 2), ([2, 5, 6], 1, 1), ([7, 8], 0, 0)])
def test_a_chain_grafts_where_the_trees_path_along_it_ends(chain, graft_at, held):
    tree = graft_chain(_small_tree(), torch.tensor(chain))
    count = len(chain)
    parents, valid = tree.parents[5:].tolist(), tree.valid[5:].tolist()
    assert valid == [depth > held for depth in range(1, count + 1)]
    assert parents[held] == graft_at and parents[held + 1:] == list(range(5 + held, 4 + count))
    assert all(p == -1 for p in parents[:held])
    assert tree.depths[5 + held:].tolist() == list(range(held + 1, count + 1))
    last = 4 + count  # the deepest chain node sees its whole path from the root, and nothing else
    expected = torch.zeros(5 + count, dtype=torch.bool)
    expected[:5] = _small_tree().tree_mask[graft_at]
    expected[5 + held:] = True
    assert torch.equal(tree.tree_mask[last], expected)
    siblings = [tree.tokens[n].item() for n in range(5 + count) if tree.parents[n] == graft_at]
    assert len(siblings) == len(set(siblings))  # no node has two children of one token
