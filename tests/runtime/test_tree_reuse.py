"""Tree cycles whose verify starts at Kangaroo's exit layer ℓ over the shallow states the drafter computed for
every tree candidate (engine `reuse_shallow_tree`), on a tiny trained target (CPU, fp32): lossless against the
target's greedy output and the same trees as a full verify; the verify runs no layer below ℓ; the confirmed
cache equals a prefill of the confirmed tokens in every layer (the accepted nodes' shallow KV is moved to their
slots, the rejected ones' is never seen); the T > 0 cycles keep the target's distribution."""
import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.methods import kangaroo
from specdraft.methods.kangaroo import drafter as kangaroo_drafter
from specdraft.decoding import graphs
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from tests.runtime.replay import ReplayOnCpu
from tests.runtime.test_chain_exits import assert_first_cycles_keep_the_target_distribution
from tests.runtime.drafts import PROMPT, hf_greedy, target_info, trained_case

PROMPTS = (PROMPT, PROMPT[3:] + PROMPT[:3])  # learnt, and not learnt
SHAPE = TreeShape(depth=4, topk=3, budget=10)
SHAPES = [SHAPE, TreeShape(depth=3, topk=2, budget=11), TreeShape(depth=1, topk=3, budget=4)]


def _engine(shape=SHAPE, reuse=True, max_len=256, use_graphs=False):
    model, spec, cfg, draft = trained_case("kangaroo")
    target = from_hf(model, target_info(model))
    engine = SpecEngine(target, spec.runtime(draft, cfg, target), shape, max_len, hf_rope_tables(model, max_len),
                        use_graphs, reuse_shallow_tree=reuse)
    return model, engine


@pytest.mark.parametrize("shape", SHAPES, ids=["deep", "every_candidate", "one_depth"])
@torch.no_grad()
def test_tree_verify_from_the_shallow_states_is_lossless(shape):
    model, reused = _engine(shape)
    _, full = _engine(shape, reuse=False)
    assert reused.tree_start_layer == reused.drafter.exit_layer and full.tree_start_layer == 0
    accepted = 0
    for prompt in PROMPTS:
        got, expected = reused.generate(prompt, 24, trace=True), full.generate(prompt, 24, trace=True)
        assert got.tokens == expected.tokens == hf_greedy(model, prompt, 24)
        assert [row["tokens"] for row in got.trace] == [row["tokens"] for row in expected.trace]  # same trees
        assert got.accepted == expected.accepted
        accepted += sum(got.accepted)
    assert accepted > 0  # multi-token commits moved shallow KV, not only roots


def _rows_through_layers(engine):
    """Forward pre-hooks on the target's layers -> {layer: [rows of each call]}, and the hooks to remove."""
    rows = {index: [] for index in range(len(engine.target.layers))}
    hooks = [layer.register_forward_pre_hook(lambda module, args, index=index: rows[index].append(args[0].shape[0]))
             for index, layer in enumerate(engine.target.layers)]
    return rows, hooks


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "full_verify"])
@torch.no_grad()
def test_a_tree_verify_with_reuse_runs_no_layer_below_the_exit(reuse):
    """One cycle: with reuse the verify's N nodes start at ℓ, and the drafting runs every candidate (C rows)
    through the shallow layers instead of rerunning its scratch region per step; the root and each depth's
    candidates are separate passes, one more than the full verify's drafting: as many as it has with its verify."""
    _, engine = _engine(reuse=reuse)
    shape, exit_layer = engine.shape, engine.drafter.exit_layer
    engine.prefill(torch.tensor(PROMPT), 0.0)
    rows, hooks = _rows_through_layers(engine)
    tree = engine.build_tree()
    drafted = {index: list(calls) for index, calls in rows.items()}
    for calls in rows.values():
        calls.clear()
    engine.verify_forward(tree)
    for hook in hooks:
        hook.remove()
    deep = range(exit_layer, len(engine.target.layers))
    assert all(rows[index] == [shape.budget] for index in deep) and all(not drafted[index] for index in deep)
    assert all(drafted[index] == drafted[0] for index in range(exit_layer))
    assert len(drafted[0]) + len(rows[0]) == shape.depth + 1  # shallow passes per cycle
    if reuse:
        assert all(rows[index] == [] for index in range(exit_layer))
        assert sum(drafted[0]) == shape.num_candidates
    else:
        assert all(rows[index] == [shape.budget] for index in range(exit_layer))
        assert sum(drafted[0]) == 1 + (shape.depth - 1) * shape.scratch


def _cache_matches_a_prefill(model, engine, sequence) -> bool:
    """Whether the engine's target cache over its confirmed slots equals (every layer, keys and values) a fresh
    prefill of the confirmed tokens, sequence[:prefix_len]."""
    prefix = int(engine.prefix_len)
    fresh = from_hf(model, target_info(model))
    fresh.allocate(engine.max_len, *hf_rope_tables(model, engine.max_len))
    tokens = torch.tensor(sequence[:prefix])
    fresh.run_layers(fresh.embed(tokens), torch.arange(prefix), torch.zeros(1, dtype=torch.long), None)
    return all(torch.allclose(mine[:, :, :prefix], theirs[:, :, :prefix], atol=1e-5)
               for mine, theirs in ((engine.target.k_cache, fresh.k_cache), (engine.target.v_cache, fresh.v_cache)))


@torch.no_grad()
def test_the_confirmed_cache_equals_a_prefill_of_the_confirmed_tokens():
    model, engine = _engine()
    sequence = PROMPT + hf_greedy(model, PROMPT, 48)
    result = engine.generate(PROMPT, 24)
    assert len(result.accepted) < 24 and _cache_matches_a_prefill(model, engine, sequence)


@torch.no_grad()
def test_shallow_kv_left_at_the_candidate_slots_is_caught(monkeypatch):
    model, engine = _engine()
    sequence = PROMPT + hf_greedy(model, PROMPT, 48)
    monkeypatch.setattr(kangaroo_drafter, "compact_kv", lambda *args: None)  # the verify's nodes keep candidate slots
    result = engine.generate(PROMPT, 24)
    assert not _cache_matches_a_prefill(model, engine, sequence) and result.tokens != sequence[len(PROMPT):][:24]


@torch.no_grad()
def test_a_tree_verify_starting_at_the_wrong_layer_is_caught():
    model, engine = _engine()
    engine.context.tree_start_layer = engine.drafter.exit_layer - 1  # states at ℓ fed to layer ℓ-1
    assert engine.generate(PROMPT, 24).tokens != hf_greedy(model, PROMPT, 24)


def test_the_candidate_slots_must_fit_the_cache():
    """C = 31 candidate slots instead of budget = 10: room for a 13-token prompt and 24 new tokens at 70 slots
    without reuse, not with it."""
    _, full = _engine(reuse=False, max_len=70)
    _, reused = _engine(max_len=70)
    full._check_room(len(PROMPT), 24)
    with pytest.raises(SpecdraftError, match="cache"):
        reused._check_room(len(PROMPT), 24)


@torch.no_grad()
def test_sampled_tree_cycles_with_reuse_keep_the_target_distribution(monkeypatch):
    model, engine = _engine()
    assert_first_cycles_keep_the_target_distribution(model, engine, PROMPTS[0], monkeypatch)


@torch.no_grad()
def test_sampled_cycles_replayed_from_static_buffers_equal_eager_ones(monkeypatch):
    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)
    runs = []
    for use_graphs in (False, True):
        _, engine = _engine(use_graphs=use_graphs)
        runs.append(engine.generate(PROMPT, 24, temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert runs[1].tokens == runs[0].tokens and runs[1].accepted == runs[0].accepted
