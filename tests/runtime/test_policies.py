"""Drafting policies (runtime.policy) on a tiny trained EAGLE-3 draft (CPU, fp32): retrieval drafts (sam, alone or
merged into the tree), SVIP's entropy stop and Dynamic Depth Decoding's mass stop (trees and chains) each give
greedy decoding's output; their CUDA-graph paths (graph outputs at fixed addresses, read by the next graph) give
the eager tokens; sampled cycles keep the target's distribution; parameters out of range are one-line errors."""
import pytest
import torch

from specdraft.config import RuntimeConfig
from specdraft.core.errors import SpecdraftError
from specdraft.decoding import graphs
from specdraft.decoding.cycles.tree import TreeCycle
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.policies.adaptive import AdaptivePolicy
from specdraft.decoding.policies.ddd import ddd_policy
from specdraft.decoding.policies.sam import SamPolicy
from specdraft.decoding.policies.suffix_automaton import Retrieval
from specdraft.decoding.policies.svip import svip_policy
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape
from tests.runtime.replay import ReplayOnCpu
from tests.runtime.sampled_cycles import first_tokens
from tests.runtime.sampled_cycles import CRITICAL, SAMPLING_TRIALS, chi_square_top
from tests.runtime.drafts import PROMPT, hf_greedy, target_info, trained_case

TREE, CHAIN = TreeShape(depth=4, topk=3, budget=10), TreeShape.chain(4)
REPEATING = PROMPT + PROMPT[:9]  # the prompt's start again: its continuation can be retrieved
POLICIES = {  # name: (shape, engine options of a fresh policy)
    "sam": (TREE, lambda: {"policy": SamPolicy(Retrieval(draft_len=6, min_match=2))}),
    "sam_merge": (TREE, lambda: {"policy": SamPolicy(Retrieval(draft_len=6, min_match=2), merge=True)}),
    "sam_chain": (CHAIN, lambda: {"policy": SamPolicy(Retrieval(draft_len=6, min_match=2))}),
    "svip_tree": (TREE, lambda: {"policy": svip_policy(0.5)}),
    "ddd_tree": (TREE, lambda: {"policy": ddd_policy(0.4)}),
    "svip_chain": (CHAIN, lambda: {"policy": svip_policy(0.5)}),
    "ddd_chain": (CHAIN, lambda: {"policy": ddd_policy(0.2)}),
    "adaptive_tree": (TREE, lambda: {"policy": AdaptivePolicy(min_depth=2, step_cost=0.2)}),
}
SHARPEN = 6.0  # the tiny draft's distributions are nearly flat (entropy > 2 nats): SVIP's bound would never pass


def _sharpened(drafter, factor):
    """The drafter with its logits scaled by `factor`: the same top-k, lower entropy (drafts stay drafts)."""
    first, step = drafter.first, drafter.step
    drafter.first = lambda *args: (lambda logits, hidden: (logits * factor, hidden))(*first(*args))
    drafter.step = lambda *args: (lambda logits, hidden: (logits * factor, hidden))(*step(*args))
    return drafter


def _engine(name, use_graphs=False):
    shape, options = POLICIES[name]
    model, spec, cfg, draft = trained_case("eagle3")
    target = from_hf(model, target_info(model))
    drafter = spec.runtime(draft, cfg, target)
    if name.startswith("svip"):
        drafter = _sharpened(drafter, SHARPEN)
    engine = SpecEngine(target, drafter, shape, 256, hf_rope_tables(model, 256), use_graphs, **options())
    return model, engine


def _varied(name, engine, results):
    """Whether the policy changed what was drafted: retrieval cycles ran, or drafts stopped short."""
    drafted = [d for result in results for d in result.drafted]
    if name.startswith("adaptive"):
        return sum(1 for count in engine.policy.counts.values() if count) > 1
    if name.startswith("sam"):
        return engine.policy.counts["retrieval"] > 0 and engine.policy.counts["model"] > 0
    return len(set(drafted)) > 1


@pytest.mark.parametrize("name", sorted(POLICIES))
@torch.no_grad()
def test_every_policy_gives_greedy_decodings_output(name):
    model, engine = _engine(name)
    results = [engine.generate(prompt, 32) for prompt in (PROMPT, REPEATING)]
    for prompt, result in zip((PROMPT, REPEATING), results):
        assert result.tokens == hf_greedy(model, prompt, 32)
        assert all(0 <= a <= d for a, d in zip(result.accepted, result.drafted))
    assert _varied(name, engine, results)


def test_the_adaptive_policy_drafts_deeper_where_drafts_are_accepted_and_shallower_where_not():
    _, engine = _engine("adaptive_tree")  # depths 2..4, a depth at 0.2 of a verify
    policy = engine.policy
    policy.begin(PROMPT)
    policy.observe([PROMPT[0]])  # the prefill's token, no cycle's
    for _ in range(40):  # every draft accepted
        depth = policy.next_depth()
        policy.observe([0] * (depth + 1))
    assert policy.next_depth() == 4
    policy.observe([0] * 5)
    for _ in range(40):  # no draft accepted
        policy.next_depth()
        policy.observe([0])
    assert policy.next_depth() == 2


@pytest.mark.parametrize("name", ["sam", "sam_merge", "ddd_tree", "svip_chain", "adaptive_tree"])
@torch.no_grad()
def test_graph_replays_give_the_eager_tokens(monkeypatch, name):
    """The graphed paths with a graph's aliasing (ReplayOnCpu): each replay writes into its first outputs."""
    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)
    _, eager = _engine(name)
    _, replayed = _engine(name, use_graphs=True)
    for prompt in (PROMPT, REPEATING):
        expected, got = eager.generate(prompt, 24), replayed.generate(prompt, 24)
        assert got.tokens == expected.tokens and got.drafted == expected.drafted


class _ReadiedReplay(ReplayOnCpu):
    """ReplayOnCpu that records whether each graph was captured (made ready) before its first call."""

    made: list = []

    def __init__(self, fn, state, example=()):
        super().__init__(fn, state, example)
        self.readied, self.called_unready = False, False
        _ReadiedReplay.made.append(self)

    def ready(self):
        self.readied = True
        return self

    def __call__(self, *args):
        self.called_unready |= not self.readied
        return super().__call__(*args)


@torch.no_grad()
def test_the_adaptive_policy_captures_every_depth_before_its_first_cycle_runs(monkeypatch):
    """A depth first chosen in the middle of a generation replays a graph captured at the first cycle: a timed run
    never pays a capture."""
    monkeypatch.setattr(graphs, "CallGraph", _ReadiedReplay)
    monkeypatch.setattr(_ReadiedReplay, "made", [])
    _, engine = _engine("adaptive_tree", use_graphs=True)
    engine.generate(PROMPT, 32)
    bodies = {graph: getattr(getattr(graph.fn, "func", None), "__self__", None) for graph in _ReadiedReplay.made}
    cycle_graphs = [graph for graph, kind in bodies.items() if isinstance(kind, TreeCycle)]  # TreeCycle.body, bound
    assert {bodies[graph].shape for graph in cycle_graphs} == set(engine.policy.shapes.values())
    assert all(graph.readied and not graph.called_unready for graph in cycle_graphs)
    assert sum(1 for count in engine.policy.counts.values() if count) > 1


@pytest.mark.slow  # 400 cycles each
@pytest.mark.parametrize("name", ["fixed_tree", "fixed_chain", "sam_merge", "sam_chain", "ddd_tree", "adaptive_tree"])
@torch.no_grad()
def test_sampled_cycles_keep_the_target_distribution(name):
    """The first token of a T=1 cycle (sampled drafts; a retrieval draft where the prompt repeats) follows the
    target's distribution (chi-square over the 4 likeliest tokens and the rest)."""
    if name.startswith("fixed"):
        model, spec, cfg, draft = trained_case("eagle3")
        target = from_hf(model, target_info(model))
        engine = SpecEngine(target, spec.runtime(draft, cfg, target), TREE if name == "fixed_tree" else CHAIN, 256,
                            hf_rope_tables(model, 256))
    else:
        model, engine = _engine(name)
    root, firsts = first_tokens(engine, REPEATING, SAMPLING_TRIALS)
    probs = torch.softmax(model(torch.tensor([REPEATING + [root]])).logits[0, -1], -1)  # [V]
    assert chi_square_top(firsts, probs) < CRITICAL


@pytest.mark.parametrize("field,value,message", [
    ("policy", "eagle", "unknown runtime.policy 'eagle'; valid: fixed, sam, svip, ddd, adaptive"),
    ("sam_min_match", 0, "runtime.sam_min_match must be at least 1, got 0"),
    ("sam_draft", 33, "runtime.sam_draft must be in 1..32, got 33"),
    ("svip_threshold", 1.0, "runtime.svip_threshold must be in (0, 1), got 1.0"),
    ("ddd_threshold", 0.0, "runtime.ddd_threshold must be in (0, 1), got 0.0"),
    ("adaptive_min_depth", 0, "runtime.adaptive_min_depth must be at least 1, got 0"),
    ("adaptive_step_cost", -0.1, "runtime.adaptive_step_cost must be >= 0, got -0.1"),
])
def test_policy_parameters_out_of_range_are_one_line_errors(field, value, message):
    with pytest.raises(SpecdraftError) as caught:
        RuntimeConfig(**{field: value})
    assert str(caught.value) == message


@torch.no_grad()
def test_a_policy_that_cannot_run_with_the_shape_says_why():
    model, spec, cfg, draft = trained_case("eagle3")
    target = from_hf(model, target_info(model))
    drafter = spec.runtime(draft, cfg, target)
    with pytest.raises(SpecdraftError, match="sam_merge grafts the retrieval draft onto a tree"):
        SpecEngine(target, drafter, CHAIN, 256, hf_rope_tables(model, 256),
                   policy=SamPolicy(Retrieval(4, 2), merge=True))
    with pytest.raises(SpecdraftError, match="chooses a tree's depth"):
        SpecEngine(target, drafter, CHAIN, 256, hf_rope_tables(model, 256), policy=AdaptivePolicy())
    with pytest.raises(SpecdraftError, match="adaptive_min_depth must be in 1..4"):
        SpecEngine(target, drafter, TREE, 256, hf_rope_tables(model, 256), policy=AdaptivePolicy(min_depth=5))
    with pytest.raises(SpecdraftError, match="both stop chains"):
        SpecEngine(target, drafter, CHAIN, 256, hf_rope_tables(model, 256), exit_threshold=0.5,
                   policy=ddd_policy(0.3))
