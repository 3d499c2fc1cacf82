"""Chain cycles (specdraft/decoding/cycles/chain.py) with Kangaroo's drafter on a tiny trained target (CPU, fp32): the
confidence exit η, the verify that starts at the exit layer over the drafter's shallow states, and the dynamic
draft length stay lossless; η makes the drafted length vary and the verify run fewer rows; drafting a chain
runs one shallow row per depth; a verify that starts at the wrong layer is caught; choosing among drafts at two
exit layers per cycle stays lossless."""
import dataclasses

import pytest
import torch

from specdraft.core.types import DraftContext
from specdraft.decoding import graphs
from specdraft.decoding.policies.dynamic_exit import DynamicExit, ExitChoice
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from tests.runtime.replay import ReplayOnCpu
from tests.runtime.drafts import PROMPT, hf_greedy, target_info, trained_case
from tests.runtime.sampled_cycles import CRITICAL, SAMPLING_TRIALS, chi_square_top

DEPTH = 5
PROMPTS = (PROMPT, PROMPT[3:] + PROMPT[:3])  # learnt, and not learnt


def _engine(use_graphs=False, max_len=256, **options):
    model, spec, cfg, draft = trained_case("kangaroo")
    target = from_hf(model, target_info(model))
    engine = SpecEngine(target, spec.runtime(draft, cfg, target), TreeShape.chain(DEPTH), max_len,
                        hf_rope_tables(model, max_len), use_graphs, **options)
    return model, engine


def _record_run_layers(engine):
    """Wraps the target's run_layers -> a list of (rows, start_layer, end_layer) per call."""
    calls, real = [], engine.target.run_layers

    def recording(hidden, positions, prefix_len, tree_mask, start_layer=0, end_layer=None, capture=()):
        calls.append((hidden.shape[0], start_layer, end_layer))
        return real(hidden, positions, prefix_len, tree_mask, start_layer, end_layer, capture)

    engine.target.run_layers = recording
    return calls


@pytest.mark.parametrize("eta", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("reuse_shallow", [True, False], ids=["reuse", "full_verify"])
@torch.no_grad()
def test_chain_with_exits_is_lossless(eta, reuse_shallow):
    model, engine = _engine(exit_threshold=eta, reuse_shallow=reuse_shallow)
    assert engine.chain.start_layer == (engine.drafter.exit_layer if reuse_shallow else 0)
    for prompt in PROMPTS:
        result = engine.generate(prompt, 24)
        assert result.tokens == hf_greedy(model, prompt, 24)
        assert all(0 <= a <= d for a, d in zip(result.accepted, result.drafted))


@torch.no_grad()
def test_dynamic_exit_is_lossless_and_varies_the_length():
    model, engine = _engine(exit_threshold=0.3, dynamic_exit=True)
    for prompt in PROMPTS:
        result = engine.generate(prompt, 32)
        assert result.tokens == hf_greedy(model, prompt, 32)
    assert engine.dynamic_exit is not None and engine.dynamic_exit.rates != [engine.dynamic_exit.prior] * DEPTH


@torch.no_grad()
def test_eta_varies_the_drafted_length_and_the_verify_runs_fewer_rows():
    _, engine = _engine(exit_threshold=0.0)
    calls = _record_run_layers(engine)
    full = engine.generate(PROMPTS[0], 24)
    exit_layer = engine.drafter.exit_layer
    verify_rows = [rows for rows, start, _ in calls if start == exit_layer]
    assert set(full.drafted) == {DEPTH} and verify_rows == [DEPTH + 1] * len(full.drafted)  # none past the 24th
    engine.set_exit_threshold(0.5)
    calls.clear()
    early = engine.generate(PROMPTS[0], 24)
    verify_rows = [rows for rows, start, _ in calls if start == exit_layer]
    assert len(set(early.drafted)) > 1 and min(early.drafted) < DEPTH  # η cut some chains short
    assert verify_rows == [d + 1 for d in early.drafted]  # each runs the drafted tokens and the root
    shallow_rows = [rows for rows, start, end in calls if end == exit_layer]
    assert set(shallow_rows) == {1}  # one shallow row per draft step, and for the one node no step ran
    assert sum(early.drafted) / len(early.drafted) < DEPTH


@pytest.mark.triton_kernels
@torch.no_grad()
def test_a_short_chain_with_exits_through_the_triton_kernels_is_lossless(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")  # training the draft (cached) with the references
    model, engine = _engine(max_len=48, exit_threshold=0.3)
    monkeypatch.setenv("SPECDRAFT_KERNELS", "auto")
    result = engine.generate(PROMPTS[0], 8)
    assert result.tokens == hf_greedy(model, PROMPTS[0], 8) and sum(result.accepted) > 0


@torch.no_grad()
def test_a_verify_starting_at_the_wrong_layer_is_caught():
    model, engine = _engine()
    engine.chain.start_layer = engine.drafter.exit_layer - 1  # states at ℓ fed to layer ℓ-1
    assert engine.generate(PROMPTS[0], 24).tokens != hf_greedy(model, PROMPTS[0], 24)


@torch.no_grad()
def test_a_reuse_that_skips_the_last_drafts_shallow_pass_is_caught(monkeypatch):
    model, engine = _engine()
    drafter = engine.drafter
    real = drafter.chain_verify_states
    monkeypatch.setattr(drafter, "chain_verify_states", lambda tokens, positions, computed:
                        torch.cat([real(tokens[:-1], positions[:-1], computed), drafter.shallow_states[:1]]))
    assert engine.generate(PROMPTS[0], 24).tokens != hf_greedy(model, PROMPTS[0], 24)


def test_dynamic_exit_prefers_short_chains_when_drafts_fail_and_long_ones_when_they_land():
    exit_ = DynamicExit(max_depth=6, draft_costs=[2.3], verify_cost=28.0)
    for _ in range(40):
        exit_.update(0, drafted=6, accepted=6)
    assert exit_.choose() == (0, 6)
    for _ in range(40):
        exit_.update(0, drafted=6, accepted=0)
    assert exit_.choose() == (0, 1)
    cheap_verify = DynamicExit(max_depth=6, draft_costs=[2.3], verify_cost=1.0, prior=0.5)
    assert cheap_verify.choose()[1] < 6  # drafting costs more than it returns
    for _ in range(400):  # unreached positions drift back toward the prior
        exit_.update(0, drafted=1, accepted=1)
    assert exit_.rates[0][5] > 0.5


def test_dynamic_exit_picks_the_exit_whose_drafts_pay_for_their_layers():
    exit_ = DynamicExit(max_depth=4, draft_costs=[2.0, 5.0], verify_cost=20.0)
    assert exit_.choose()[0] == 0  # same prior rates: the cheaper exit
    for _ in range(60):
        exit_.update(0, drafted=4, accepted=0)
        exit_.update(1, drafted=4, accepted=4)
    assert exit_.choose() == (1, 4)


@pytest.mark.parametrize("options", [{}, {"exit_threshold": 0.6}, {"exit_threshold": 0.3, "dynamic_exit": True}],
                         ids=["whole", "eta", "eta_del"])
@torch.no_grad()
def test_static_buffer_replays_give_the_eager_tokens(monkeypatch, options):
    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)  # the prefill's graphs too, padded as on a GPU
    _, eager = _engine(**options)
    _, replayed = _engine(use_graphs=True, **options)
    for prompt in PROMPTS:
        expected, got = eager.generate(prompt, 24), replayed.generate(prompt, 24)
        assert got.tokens == expected.tokens and got.drafted == expected.drafted
    assert _chain_graph_keys(replayed)


def _chain_graph_keys(engine):
    """The keys of the chain cycle's CUDA graphs (their last element: the drafter variant)."""
    return [key for key in engine.graphs.keys() if isinstance(key, tuple) and key[0] == "chain"]


def _first_cycle_tokens(engine, prompt, trials):
    """Prefill at T=0 (a fixed root), then one cycle at T=1 from the same state -> (root, its first emitted token
    per trial). A cycle writes cache slots from the prefix on only, so resetting the prefix and root resets it."""
    generator, firsts = torch.Generator().manual_seed(0), []
    root = engine.prefill(torch.tensor(prompt), 0.0)
    saved = [t.clone() for t in (engine.prefix_len, engine.root, engine.drafter.prefix_len)]
    for _ in range(trials):
        for tensor, value in zip((engine.prefix_len, engine.root, engine.drafter.prefix_len), saved):
            tensor.copy_(value)
        firsts.append(int(engine.cycle(1.0, generator).output.emitted[0]))
    return root, torch.tensor(firsts)


def assert_first_cycles_keep_the_target_distribution(model, engine, prompt, monkeypatch) -> None:
    """The first sampled cycle's first token follows the target's distribution (chi-square), and a sampler that
    resamples a rejected point-mass draft (no ban) fails the same test. (A rejected sampled draft leaves the
    residual max(0, p - q), which bans nothing: the broken sampler drafts point masses.)"""
    root, firsts = _first_cycle_tokens(engine, prompt, SAMPLING_TRIALS)
    probs = torch.softmax(model(torch.tensor([prompt + [root]])).logits[0, -1], -1)  # [V]
    assert chi_square_top(firsts, probs) < CRITICAL
    from specdraft.kernels.tree_sample import reference as acceptance

    monkeypatch.setattr(acceptance, "_ban_rejected", lambda probs, tokens, rejected: probs)
    monkeypatch.setattr(engine, "sample_drafts", False)
    _, broken = _first_cycle_tokens(engine, prompt, SAMPLING_TRIALS // 2)  # resamples the rejected draft
    assert chi_square_top(broken, probs) > CRITICAL


@torch.no_grad()
def test_sampled_chain_cycles_with_exits_keep_the_target_distribution(monkeypatch):
    model, engine = _engine(exit_threshold=0.3, dynamic_exit=True)
    assert_first_cycles_keep_the_target_distribution(model, engine, PROMPTS[0], monkeypatch)


def _exit_choice_engine(use_graphs=False):
    """Drafts at ℓ = 2 (trained) and ℓ = 1 (untrained: its drafts fail) over one target, DEL choosing."""
    model, spec, cfg, trained = trained_case("kangaroo")
    shallow_cfg = dataclasses.replace(cfg, exit_layer=1)
    torch.manual_seed(1)
    untrained = spec.build(shallow_cfg, DraftContext(target_info(model))).eval()
    target = from_hf(model, target_info(model))
    choice = ExitChoice([spec.runtime(trained, cfg, target), spec.runtime(untrained, shallow_cfg, target)])
    engine = SpecEngine(target, choice, TreeShape.chain(DEPTH), 256, hf_rope_tables(model, 256), use_graphs,
                        exit_threshold=0.2, dynamic_exit=True)
    chosen, select = [], choice.select_exit
    choice.select_exit = lambda index: chosen.append(choice.caps.exit_layers[index]) or select(index)
    return model, engine, chosen


@torch.no_grad()
def test_choosing_the_exit_layer_per_cycle_is_lossless(monkeypatch):
    model, engine, chosen = _exit_choice_engine()
    assert engine.chain.start_layer == 1 and engine.drafter.caps.exit_layers == (1, 2)
    results = [engine.generate(prompt, 32) for prompt in PROMPTS]
    for prompt, result in zip(PROMPTS, results):
        assert result.tokens == hf_greedy(model, prompt, 32)
    assert chosen[0] == 1 and set(chosen) == {1, 2}  # the cheap exit first, the one whose drafts land later
    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)  # the prefill's graphs too, padded as on a GPU
    _, replayed, replayed_chosen = _exit_choice_engine(use_graphs=True)
    for prompt, result in zip(PROMPTS, results):
        got = replayed.generate(prompt, 32)
        assert got.tokens == result.tokens and got.drafted == result.drafted
    assert replayed_chosen == chosen and {key[-1] for key in _chain_graph_keys(replayed)} == {0, 1}
