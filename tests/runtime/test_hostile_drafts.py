"""The runtime trusts nothing a draft returns (CPU, fp32, a tiny random target): a drafter whose logits hold NaN,
+inf or nothing but -inf at random rows of every drafting stage (`first`, every `step` depth), whose hidden states
are NaN, whose vocabulary map (d2t) sends ids outside the target's vocabulary and onto one another, a block drafter
whose proposals are broken the same ways (with that map), and a tree scorer that answers NaN, inf and random
scores, cost acceptance only: at T=0 every chain and tree (a block drafter's too) decodes the target's greedy output
exactly (with and without a scorer, both prune places, both verify sizes), at T > 0 the
first token of a cycle follows the target's distribution (the chi-square the chain tests use). Without the guards
(the selection's root, the draft top-k's trust of a row) the same drafts change the output: the test can fail."""
from __future__ import annotations

import logging

import pytest
import torch

from specdraft.core.drafting import Drafter
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.vocabulary import checked_d2t
from tests.runtime.block_drafter import RandomBlockDrafter
from tests.runtime.oracle import OracleDrafter
from tests.runtime.peaked_target import greedy_tokens, peaked_llama
from tests.runtime.sampled_cycles import first_tokens_from_prefix
from tests.runtime.sampled_cycles import CRITICAL, chi_square_top
from tests.runtime.hostile_logits import break_rows

VOCAB = 320
CHAIN, TREE = TreeShape.chain(3), TreeShape(depth=3, topk=3, budget=10)


class HostileDrafter(Drafter):
    """The oracle's drafts (the target's own continuation: acceptance to lose), broken at every stage: random rows
    of `first`'s and each `step`'s logits (module docstring), NaN hidden states, a d2t map with ids outside the
    vocabulary and ids two draft indices share."""

    def __init__(self, sequence, seed: int = 0):
        self.oracle = OracleDrafter(sequence, VOCAB, wrong_every=4)
        self.feature_layers = self.oracle.feature_layers
        d2t = torch.zeros(VOCAB, dtype=torch.long)
        d2t[7], d2t[11], d2t[13] = 10_000, -50, 5  # 7 and 11 outside the target's vocabulary, 13 onto 18
        self.d2t = d2t
        self.generator = torch.Generator().manual_seed(seed)

    def allocate(self, max_len, scratch, device, dtype):
        self.oracle.allocate(max_len, scratch, device, dtype)
        self.d2t = self.d2t.to(device)

    def ingest(self, features, next_tokens, start, count):
        self.oracle.ingest(features, next_tokens, start, count)

    def first(self, root_token, position):
        logits, hidden = self.oracle.first(root_token, position)
        return break_rows(logits, self.generator), torch.full_like(hidden, float("nan"))

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        logits, hidden = self.oracle.step(depth, hidden, tokens, positions, scratch_slots, scratch_visible)
        return break_rows(logits, self.generator), torch.full_like(hidden, float("nan"))


class HostileBlockDrafter(RandomBlockDrafter):
    """A block drafter (DrafterCaps.block_size) whose proposals are broken as HostileDrafter's logits are (random
    rows of every block), with the same broken vocabulary map."""

    def __init__(self, sequence, seed: int = 0):
        super().__init__(sequence, VOCAB, block_size=4, wrong_every=4, seed=seed)
        self.d2t = HostileDrafter(sequence).d2t
        self.breaks = torch.Generator().manual_seed(seed)

    def propose(self, root_token, prefix_len):
        return break_rows(super().propose(root_token, prefix_len), self.breaks)


class HostileScorer:
    """A tree scorer whose answers are garbage: each child's score NaN, +inf, -inf (dropped), a random number or
    its own log-probability."""

    threshold = 0.5
    chain_threshold = 0.5

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def prune(self, child_logprobs, parent_scores, parent_logits, depth):
        choice = torch.randint(5, child_logprobs.shape, generator=self.generator)
        garbage = torch.tensor([float("nan"), float("inf"), float("-inf"), 3.0, 0.0])[choice]
        return torch.where(choice == 4, child_logprobs, garbage)


def _engine(model, shape, prompt, max_len=256, drafter_type=None, **options):
    info = TargetInfo.from_hf_config(model.config, "tiny")
    drafter = (drafter_type or HostileDrafter)(prompt + greedy_tokens(model, prompt, 64))
    return SpecEngine(from_hf(model, info), drafter, shape, max_len, hf_rope_tables(model, max_len), **options)


PROMPT = torch.randint(0, 300, (11,), generator=torch.Generator().manual_seed(4)).tolist()
CASES = {  # name: (shape, engine options)
    "chain": (CHAIN, {}),
    "chain_scorer": (CHAIN, {"tree_scorer": HostileScorer()}),
    "tree": (TREE, {}),
    "tree_scorer_selection_kept": (TREE, {"tree_scorer": HostileScorer(), "prune_at": "selection"}),
    "tree_scorer_expansion_kept": (TREE, {"tree_scorer": HostileScorer(), "prune_at": "expansion"}),
    "tree_scorer_expansion_budget": (TREE, {"tree_scorer": HostileScorer(), "prune_at": "expansion",
                                            "prune_verify": "budget"}),
    "block_chain": (CHAIN, {"drafter_type": HostileBlockDrafter}),
    "block_tree": (TREE, {"drafter_type": HostileBlockDrafter}),
    "block_tree_scorer": (TREE, {"drafter_type": HostileBlockDrafter, "tree_scorer": HostileScorer(),
                                 "prune_at": "expansion", "prune_verify": "budget"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
@torch.no_grad()
def test_broken_drafts_at_t0_decode_the_targets_greedy_output(name):
    model = peaked_llama()
    shape, options = CASES[name]
    engine = _engine(model, shape, PROMPT, **options)
    result = engine.generate(PROMPT, 40)
    assert result.tokens == greedy_tokens(model, PROMPT, 40)
    assert all(0 <= a <= d for a, d in zip(result.accepted, result.drafted))


@torch.no_grad()
def test_without_the_guards_the_same_drafts_change_the_output(monkeypatch):
    """The drafts of `test_broken_drafts_at_t0...` through the top-k and selection as they were without the guards
    (NaN scores kept, the root ranked below NaN): the target's output is lost."""
    from specdraft.decoding import tree as tree_module

    def unguarded_topk(draft_logits, d2t, k):
        logits = draft_logits.float()
        ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
        return torch.log_softmax(logits, dim=-1).gather(-1, ids), ids + d2t[ids]

    def unguarded_select(cand_tokens, cand_parents, cand_scores, budget, max_depth):
        from specdraft.kernels.tree_select.reference import TreeSelection, ancestry

        count, index = cand_scores.shape[0], torch.arange(cand_scores.shape[0])
        scores = torch.where(index == 0, float("inf"), cand_scores)  # a NaN sorts above the root's +inf
        chosen = torch.sort(torch.sort(scores, descending=True, stable=True).indices[:budget]).values
        node_of = torch.full((count,), -1, dtype=torch.long)
        node_of[chosen] = torch.arange(budget)
        parents = torch.where(torch.arange(budget) == 0, -1, node_of[cand_parents[chosen].clamp(min=0)])
        reach = ancestry(parents, max_depth)
        valid = reach[:, 0] & (cand_scores[chosen] > float("-inf"))
        return TreeSelection(tokens=cand_tokens[chosen], parents=torch.where(valid, parents, -1),
                             depths=torch.where(valid, reach.sum(1) - 1, 1), valid=valid,
                             tree_mask=reach & valid[:, None] | torch.eye(budget, dtype=torch.bool),
                             joint_logprobs=torch.where(valid, cand_scores[chosen], float("-inf")), chosen=chosen)

    monkeypatch.setattr(tree_module, "draft_topk", unguarded_topk)
    monkeypatch.setattr(tree_module, "select_tree", unguarded_select)
    model = peaked_llama()
    engine = _engine(model, TREE, PROMPT)
    assert engine.generate(PROMPT, 40).tokens != greedy_tokens(model, PROMPT, 40)


@pytest.mark.parametrize("name", ["chain", "tree", "tree_scorer_expansion_kept", "block_chain", "block_tree"])
@torch.no_grad()
def test_broken_drafts_at_t1_keep_the_targets_distribution(name):
    model = peaked_llama()
    shape, options = CASES[name]
    engine = _engine(model, shape, PROMPT, **options)
    root, firsts = first_tokens_from_prefix(engine, PROMPT, 400)
    assert ((firsts >= 0) & (firsts < VOCAB)).all()
    probs = torch.softmax(model(torch.tensor([PROMPT + [root]])).logits[0, -1], -1)  # [V]
    assert chi_square_top(firsts, probs) < CRITICAL


@torch.no_grad()
def test_a_sampled_draft_from_a_broken_row_is_verified_as_a_point_mass(monkeypatch):
    """Without the point mass (a broken row's log q left NaN), the bonus after a rejected sampled draft is drawn from
    NaN weights: the first tokens leave the target's distribution (the T > 0 test above can fail)."""
    from specdraft.decoding.cycles import chain as chain_module
    from specdraft.kernels.sampled_topk import reference

    def nan_q(draft_logits, d2t, k, exponential, temperature, logprobs_out=None):
        scores, ids, logprobs = reference.sampled_topk_reference(draft_logits, d2t, k, exponential, temperature,
                                                                 logprobs_out)
        broken = ~torch.isfinite(torch.logsumexp(draft_logits.float(), -1, keepdim=True))
        logprobs.copy_(torch.where(broken, float("nan"), logprobs))
        return scores, ids, logprobs

    monkeypatch.setattr(chain_module, "sampled_topk", nan_q)
    model = peaked_llama()
    engine = _engine(model, CHAIN, PROMPT)
    root, firsts = first_tokens_from_prefix(engine, PROMPT, 200)
    probs = torch.softmax(model(torch.tensor([PROMPT + [root]])).logits[0, -1], -1)
    outside = (firsts < 0) | (firsts >= VOCAB)
    assert outside.any() or chi_square_top(firsts, probs) > CRITICAL


def test_a_vocabulary_map_is_used_as_it_is_or_repaired_into_distinct_ids_of_the_target(caplog):
    valid = torch.tensor([3, 3, 0, -2, 10])  # ids 3, 4, 2, 1, 14 of 16
    assert checked_d2t(valid, 16) is valid
    bad = torch.tensor([0, 0, 98, -5, 1, 0])  # ids 0, 1 (kept), 100 and -2 (outside), 5, 5 (taken)
    with caplog.at_level(logging.WARNING, logger="specdraft.decoding.vocabulary"):
        repaired = checked_d2t(bad, 8)
    ids = torch.arange(6) + repaired
    assert ids[[0, 1, 4]].tolist() == [0, 1, 5]  # the first index of each id keeps it
    assert len(set(ids.tolist())) == 6 and ((ids >= 0) & (ids < 8)).all()
    assert "3 of its 6 ids" in caplog.text
    with pytest.raises(SpecdraftError, match="more than the target's 4"):
        checked_d2t(torch.zeros(5, dtype=torch.long), 4)
