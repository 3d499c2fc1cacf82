"""The block drafter's cycle (decoding/cycles/block.py) on a tiny random target, CPU, fp32, with a fake block drafter
(random proposals from a fixed generator, the right token boosted at most positions): the engine picks the kind from
the drafter's declared block_size; at T=0 chains and block trees decode the target's greedy output exactly, eager
and replayed from static buffers (a CUDA graph's aliasing on the CPU); at T=1 the first token of a cycle follows the
target's distribution; the shape is checked against the block."""
from __future__ import annotations

import pytest
import torch

from specdraft.config import RuntimeConfig
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.decoding.cycles.block import BlockCycle
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.runtime.load import tree_shape
from tests.runtime.block_drafter import RandomBlockDrafter
from tests.runtime.peaked_target import greedy_tokens, peaked_llama
from tests.runtime.sampled_cycles import first_tokens_from_prefix
from tests.runtime.sampled_cycles import CRITICAL, chi_square_top

VOCAB, BLOCK = 320, 5
SHAPES = {"chain": TreeShape.chain(BLOCK - 1), "short_chain": TreeShape.chain(2),
          "tree": TreeShape(depth=BLOCK - 1, topk=3, budget=10), "wide_tree": TreeShape(depth=3, topk=4, budget=14)}
PROMPT = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(6)).tolist()


def _engine(model, shape, drafter, use_graphs=False, max_len=256, **options):
    info = TargetInfo.from_hf_config(model.config, "tiny")
    return SpecEngine(from_hf(model, info), drafter, shape, max_len, hf_rope_tables(model, max_len), use_graphs,
                      **options)


@pytest.mark.parametrize("name", sorted(SHAPES))
@torch.no_grad()
def test_block_cycles_decode_the_targets_greedy_output(name, monkeypatch):
    """Eager and replayed (graph aliasing on the CPU): the target's greedy tokens; cycles accept blocks deep and
    shallow; every cycle's ingest continues the confirmed prefix."""
    from specdraft.decoding import graphs
    from tests.runtime.replay import ReplayOnCpu

    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)
    model, shape = peaked_llama(), SHAPES[name]
    greedy = greedy_tokens(model, PROMPT, 64)
    runs = []
    for use_graphs in (False, True):
        drafter = RandomBlockDrafter(PROMPT + greedy, VOCAB, BLOCK, wrong_every=7)
        engine = _engine(model, shape, drafter, use_graphs)
        assert isinstance(engine.own_kind, BlockCycle)  # chosen from DrafterCaps.block_size alone
        result = engine.generate(PROMPT, 40)
        assert result.tokens == greedy[:40]
        assert all(0 <= a <= shape.depth for a in result.accepted)
        assert max(result.accepted) == shape.depth and min(result.accepted[:-1]) < shape.depth
        assert set(result.drafted) == {shape.budget - 1}
        starts = [start for start, _ in drafter.ingested]
        assert all(s + c == nxt for (s, c), nxt in zip(drafter.ingested, starts[1:]))
        runs.append(result)
    assert runs[0].accepted == runs[1].accepted


@torch.no_grad()
def test_a_block_tree_recovers_where_the_chain_is_cut():
    """Where a position's first choice is wrong (every third position here), the tree's second choice at that
    depth carries the path on: a block tree accepts more per cycle than the chain of the same proposals."""
    model = peaked_llama()
    greedy = greedy_tokens(model, PROMPT, 64)
    taus = {}
    for name in ("chain", "tree"):
        drafter = RandomBlockDrafter(PROMPT + greedy, VOCAB, BLOCK, wrong_every=3)
        positions = torch.arange(drafter.table.shape[0])
        drafter.table[positions, drafter.sequence] = 8.0  # the right token second where it is not boosted,
        drafter.table[positions, (drafter.sequence + 1) % VOCAB] = 10.0  # a wrong one first
        result = _engine(model, SHAPES[name], drafter).generate(PROMPT, 40)
        assert result.tokens == greedy[:40]
        taus[name] = sum(result.accepted) / len(result.accepted)
    assert taus["tree"] > taus["chain"]


@pytest.mark.parametrize("name", ["chain", "tree"])
@torch.no_grad()
def test_block_cycles_at_t1_keep_the_targets_distribution(name):
    model = peaked_llama()
    drafter = RandomBlockDrafter(PROMPT + greedy_tokens(model, PROMPT, 64), VOCAB, BLOCK)
    engine = _engine(model, SHAPES[name], drafter)
    root, firsts = first_tokens_from_prefix(engine, PROMPT, 400)
    probs = torch.softmax(model(torch.tensor([PROMPT + [root]])).logits[0, -1], -1)  # [V]
    assert chi_square_top(firsts, probs) < CRITICAL


@torch.no_grad()
def test_sampled_block_cycles_run_to_the_end_in_the_vocabulary():
    model = peaked_llama()
    drafter = RandomBlockDrafter(PROMPT + greedy_tokens(model, PROMPT, 64), VOCAB, BLOCK)
    result = _engine(model, SHAPES["tree"], drafter).generate(PROMPT, 30, temperature=0.7,
                                                              generator=torch.Generator().manual_seed(1))
    assert len(result.tokens) == 30 and all(0 <= t < VOCAB for t in result.tokens)


def test_a_shape_deeper_than_the_block_and_a_policy_are_refused():
    from specdraft.decoding.policies.adaptive import AdaptivePolicy

    model = peaked_llama()
    drafter = RandomBlockDrafter([1, 2, 3], VOCAB, BLOCK)
    with pytest.raises(SpecdraftError, match="deeper than the block drafter's 4 proposals"):
        _engine(model, TreeShape.chain(BLOCK), drafter)
    with pytest.raises(SpecdraftError, match="drop --policy"):
        _engine(model, SHAPES["chain"], drafter, policy=AdaptivePolicy(2, 0.1))


def test_a_block_drafters_default_shape_is_the_chain_of_its_proposals():
    assert tree_shape(RuntimeConfig(), block_size=16) == TreeShape.chain(15)
    assert tree_shape(RuntimeConfig(chain=True), block_size=16) == TreeShape.chain(15)
    assert tree_shape(RuntimeConfig(depth=6), block_size=16) == TreeShape.chain(6)  # a depth alone: its chain
    assert tree_shape(RuntimeConfig(topk=4, budget=32), block_size=16) == TreeShape(15, 4, 32)
    assert tree_shape(RuntimeConfig()) == TreeShape()  # a drafter of depth steps: as before


@torch.no_grad()
def test_the_cycle_profiler_drafts_by_the_blocks_proposals():
    """`bench`'s cycle profile times the block cycle's own draft phase (one propose, its tree), not a step drafter's
    tree expansion, which a block drafter does not have."""
    from types import SimpleNamespace

    from specdraft.runtime.profile import profile_cycles

    model = peaked_llama()
    for name in ("chain", "tree"):
        drafter = RandomBlockDrafter(PROMPT + greedy_tokens(model, PROMPT, 64), VOCAB, BLOCK)
        profile = profile_cycles(SimpleNamespace(engine=_engine(model, SHAPES[name], drafter)), PROMPT, cycles=3)
        assert set(profile["eager_ms"]) == {"draft", "verify", "bookkeeping"} and profile["eager_cycle_ms"] > 0
