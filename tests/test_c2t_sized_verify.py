"""A pruned tree verified at the size of what its scorer keeps (decoding/cycles/sized_verify.py) on the tiny chat target
(CPU): the target's own output, the same cycles as the budget's verify with fewer rows, padding never accepted,
the sizes it picks, and pruning from the selection (tree.py's prune_at)."""
from __future__ import annotations

import pytest
import torch

from specdraft.config import RuntimeConfig
from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import ExactGreedy
from specdraft.decoding.tree import DraftTree, kept_first, tree_rows, verify_size, verify_sizes
from specdraft.runtime.load import load_runtime
from tests.distilled import CHAT_PROMPTS

pytestmark = pytest.mark.reference_kernels

SHAPE = {"depth": 3, "topk": 4, "budget": 20}  # 37 candidates; verified at 8, 16 or 20 rows
PROMPTS = CHAT_PROMPTS[:3] + ["an unseen question?"]


class JointCut:
    """A tree scorer that keeps a child whose joint log-probability is at least `cut` (monotone along a path, so
    its kept set is closed under ancestors, as a classifier's need not be)."""

    chain_threshold = 0.0

    def __init__(self, cut: float):
        self.cut, self.threshold = cut, 0.5

    def prune(self, child_logprobs, parent_scores, parent_logits, depth):
        joint = parent_scores.float()[:, None] + child_logprobs.float()  # [p, k]
        return torch.where(joint >= self.cut, child_logprobs.float(), float("-inf"))


@pytest.fixture(scope="module")
def runtime(chat_base_export):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDRAFT_KERNELS", "reference")
        return load_runtime(chat_base_export, RuntimeConfig(device="cpu", dtype="float32", max_len=256, **SHAPE))


def _generate(runtime, scorer=None, temperature=0.0, **options):
    """Every prompt decoded with `scorer` and the engine's prune options -> the results."""
    engine = runtime.engine
    engine.set_tree_scorer(scorer)
    engine.set_prune_options(**{"prune_at": "expansion", "prune_verify": "kept", **options})
    generator = torch.Generator().manual_seed(0)
    return [engine.generate(runtime.encode_chat(text), 24, runtime.eos_ids, temperature=temperature,
                            generator=generator) for text in PROMPTS]


def test_verify_sizes_are_multiples_of_eight_up_to_the_budget():
    assert verify_sizes(40) == (8, 16, 24, 32, 40)
    assert verify_sizes(60) == (8, 16, 24, 32, 40, 48, 56, 60)
    assert verify_sizes(20) == (8, 16, 20) and verify_sizes(5) == (5,)
    sizes = verify_sizes(40)
    assert [verify_size(kept, sizes) for kept in (1, 8, 9, 16, 17, 33, 40)] == [8, 8, 16, 16, 24, 40, 40]


def test_kept_first_moves_real_nodes_ahead_with_their_tree():
    """Nodes 1 and 4 are padding: the real ones move ahead in their order, parents and mask renumbered."""
    valid = torch.tensor([True, False, True, True, False, True])
    parents = torch.tensor([-1, -1, 0, 2, -1, 3])
    reach = torch.eye(6, dtype=torch.bool)
    for node, ancestors in {2: [0], 3: [0, 2], 5: [0, 2, 3]}.items():
        reach[node, ancestors] = True
    tree = DraftTree(tokens=torch.tensor([9, 1, 2, 3, 4, 5]), parents=parents, depths=torch.tensor([0, 1, 1, 2, 1, 3]),
                     valid=valid, tree_mask=reach, joint_logprobs=torch.tensor([0.0, -9, -1, -2, -9, -3]),
                     candidate_ids=torch.arange(6))
    moved = kept_first(tree)
    assert moved.tokens.tolist() == [9, 2, 3, 5, 1, 4] and moved.valid.tolist() == [True] * 4 + [False] * 2
    assert moved.parents.tolist() == [-1, 0, 1, 2, -1, -1] and moved.depths.tolist() == [0, 1, 2, 3, 1, 1]
    assert moved.candidate_ids.tolist() == [0, 2, 3, 5, 1, 4]
    cut = tree_rows(moved, 5)
    assert cut.tree_mask.tolist() == [[True, False, False, False, False], [True, True, False, False, False],
                                      [True, True, True, False, False], [True, True, True, True, False],
                                      [False, False, False, False, True]]


def test_padding_rows_are_never_accepted():
    """Padding rows that carry the target's own next tokens, under no node: the exact walk takes none of them."""
    tokens = torch.tensor([7, 3, 5, 5])  # root, a real child the target rejects, two padding rows
    logits = torch.full((4, 10), -5.0)
    logits[:, 5] = 5.0  # the target's argmax is 5 at every row
    tree = DraftTree(tokens=tokens, parents=torch.tensor([-1, 0, -1, -1]), depths=torch.tensor([0, 1, 1, 1]),
                     valid=torch.tensor([True, True, False, False]), tree_mask=torch.eye(4, dtype=torch.bool),
                     joint_logprobs=torch.tensor([0.0, -1.0, float("-inf"), float("-inf")]))
    nodes, length, bonus = ExactGreedy().accept(logits, tree, 3)
    assert nodes.tolist() == [0, -1, -1, -1] and length.tolist() == [0] and bonus.tolist() == [5]


def test_sized_verify_is_lossless_and_verifies_fewer_rows(runtime):
    engine = runtime.engine
    plain = [engine.decode_plain(runtime.encode_chat(text), 24, runtime.eos_ids).tokens for text in PROMPTS]
    unpruned = _generate(runtime)
    sized = _generate(runtime, JointCut(-3.2))
    budget = _generate(runtime, JointCut(-3.2), prune_verify="budget")
    for plain_tokens, free, kept, full in zip(plain, unpruned, sized, budget):
        assert kept.tokens == plain_tokens == free.tokens == full.tokens
        assert (kept.accepted, kept.drafted) == (full.accepted, full.drafted)  # the same trees, fewer rows
        assert set(kept.verify_rows) <= set(verify_sizes(SHAPE["budget"])) and set(full.verify_rows) == {20}
        assert all(d + 1 <= rows < d + 1 + 8 or rows == 20 for d, rows in zip(kept.drafted, kept.verify_rows))
    drafted = lambda results: sum(sum(r.drafted) for r in results) / sum(len(r.drafted) for r in results)  # noqa
    rows = [rows for result in sized for rows in result.verify_rows]
    assert drafted(sized) < 0.8 * drafted(unpruned) == 0.8 * (SHAPE["budget"] - 1)
    assert sum(rows) / len(rows) < SHAPE["budget"] and min(rows) < SHAPE["budget"]


def test_accepted_nodes_of_a_sized_tree_are_real(runtime):
    engine = runtime.engine
    engine.set_tree_scorer(JointCut(-3.2))
    engine.set_prune_options(prune_at="expansion", prune_verify="kept")
    result = engine.generate(runtime.encode_chat(PROMPTS[0]), 24, runtime.eos_ids, trace=True)
    for row in result.trace:
        assert all(row["valid"][node] for node in row["accepted_nodes"])
        rows = len(row["valid"])
        assert row["valid"] == sorted(row["valid"], reverse=True) and rows in verify_sizes(SHAPE["budget"])


def test_pruning_from_the_selection_drops_selected_nodes_only(runtime):
    """prune_at selection: the unpruned tree's nodes, the ones the scorer drops (and their descendants) padding;
    lossless, sized, at T=0 and T>0."""
    engine = runtime.engine
    engine.prefill(torch.tensor(runtime.encode_chat(PROMPTS[1])), 0.0)
    engine.set_tree_scorer(None)
    unpruned = engine.build_tree()
    engine.set_tree_scorer(JointCut(-3.2))
    engine.set_prune_options(prune_at="selection")
    selected = engine.build_tree()
    assert torch.equal(selected.tokens, unpruned.tokens) and torch.equal(selected.candidate_ids, unpruned.candidate_ids)
    kept = unpruned.valid & (unpruned.joint_logprobs >= -3.2)
    assert torch.equal(selected.valid, kept) and 1 < int(kept.sum()) < SHAPE["budget"]
    plain = engine.decode_plain(runtime.encode_chat(PROMPTS[1]), 24, runtime.eos_ids).tokens
    assert _generate(runtime, JointCut(-3.2), prune_at="selection")[1].tokens == plain
    sampled = _generate(runtime, JointCut(-3.2), temperature=1.0, prune_at="selection")
    assert all(set(result.verify_rows) <= set(verify_sizes(SHAPE["budget"])) for result in sampled)


def test_bad_prune_options_are_one_line():
    with pytest.raises(SpecdraftError, match="runtime.prune_at 'anywhere'; valid: expansion, selection"):
        RuntimeConfig(prune_at="anywhere")
    with pytest.raises(SpecdraftError, match="runtime.prune_verify 'some'; valid: kept, budget"):
        RuntimeConfig(prune_verify="some")


@pytest.mark.gpu
def test_sized_verify_runs_in_cuda_graphs_one_per_size(chat_base_export):
    """On a GPU: the drafting graph, then a verify graph per size, all captured at the first cycle (T=0), the same
    cycles as the budget's one-graph verify, and plain decoding's output (float32)."""
    runtime = load_runtime(chat_base_export, RuntimeConfig(device="cuda", dtype="float32", max_len=256, **SHAPE))
    engine = runtime.engine
    assert engine.use_graphs
    plain = [engine.decode_plain(runtime.encode_chat(text), 24, runtime.eos_ids).tokens for text in PROMPTS]
    sized = _generate(runtime, JointCut(-3.2))
    verify_graphs = [key for key in engine.graphs.keys() if ":verify@" in key]
    assert sorted(int(key.rsplit("@", 1)[1]) for key in verify_graphs) == list(verify_sizes(SHAPE["budget"]))
    budget = _generate(runtime, engine.tree_scorer, prune_verify="budget")
    for plain_tokens, kept, full in zip(plain, sized, budget):
        assert kept.tokens == full.tokens == plain_tokens
        assert (kept.accepted, kept.drafted) == (full.accepted, full.drafted)
        assert min(kept.verify_rows) < SHAPE["budget"] and set(full.verify_rows) == {SHAPE["budget"]}
