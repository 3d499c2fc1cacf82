"""The runtime's target and engine on tiny random models, CPU, fp32: exact against Hugging Face."""
import logging
from functools import partial

import pytest
import torch

from specdraft.core.types import TargetInfo
from specdraft.decoding.cycles.base import CycleKind, CycleRun
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import DraftTree, TreeShape
from specdraft.kernels.draft_topk import draft_topk
from tests.runtime.oracle import OracleDrafter
from tests.runtime.drafts import hf_greedy, tiny_hf


def _engine(model, drafter=None, shape=TreeShape.chain(3), max_len=256):
    info = TargetInfo.from_hf_config(model.config, "tiny")
    return SpecEngine(from_hf(model, info), drafter, shape, max_len, hf_rope_tables(model, max_len))


@pytest.mark.parametrize("kind", ["llama", "llama_tied", "qwen2", "llama3_rope"])
def test_target_matches_hugging_face(kind):
    model = tiny_hf(kind)
    prompt = torch.randint(0, 300, (40,))
    engine = _engine(model)
    hidden, _ = engine.target.run_layers(engine.target.embed(prompt), torch.arange(40), engine.prefix_len, None)
    expected = model(prompt[None]).logits[0]
    torch.testing.assert_close(engine.target.logits(hidden), expected, atol=1e-4, rtol=1e-4)
    assert engine.decode_plain(prompt.tolist(), 30).tokens == hf_greedy(model, prompt.tolist(), 30)


SHAPES = [TreeShape.chain(4), TreeShape(depth=4, topk=2, budget=9), TreeShape(depth=3, topk=3, budget=12)]


def _run_oracle(shape, wrong_every):
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (17,), generator=torch.Generator().manual_seed(1)).tolist()
    greedy = hf_greedy(model, prompt, 48)
    drafter = OracleDrafter(prompt + greedy, 320, wrong_every)
    result = _engine(model, drafter, shape).generate(prompt, 40)
    assert result.tokens == greedy[:40]  # lossless whatever the drafts
    starts = [start for start, _, _ in drafter.ingested]
    counts = [count for _, count, _ in drafter.ingested]
    assert starts[0] == 0 and counts[0] == len(prompt)
    assert all(s + c == nxt for s, c, nxt in zip(starts, counts, starts[1:]))  # contiguous confirmed prefix
    assert len(counts) == 1 + len(result.accepted)  # no cycle queued past the 40th token (overlap on)
    assert [c - 1 for c in counts[1:]] == result.accepted
    return result


@pytest.mark.parametrize("shape", SHAPES)
def test_speculative_equals_greedy_and_accepts_everything_from_a_perfect_draft(shape):
    result = _run_oracle(shape, wrong_every=0)
    assert all(a == shape.depth for a in result.accepted[:-1])


def test_a_tree_recovers_from_wrong_first_choices_that_cut_a_chain():
    chain = _run_oracle(SHAPES[0], wrong_every=3)
    assert 0 < max(chain.accepted) and min(chain.accepted) < 4
    for shape in SHAPES[1:]:
        tree = _run_oracle(shape, wrong_every=3)
        assert sum(tree.accepted) / len(tree.accepted) > sum(chain.accepted) / len(chain.accepted)


def _count_plain_steps(engine):
    calls = []
    step = engine.plain_step
    engine.plain_step = lambda token: calls.append(1) or step(token)
    return calls


@pytest.mark.parametrize("overlap", [True, False])
def test_plain_decoding_queues_no_step_past_the_last_token_asked_for(overlap):
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    engine = _engine(model)
    engine.overlap = overlap
    steps = _count_plain_steps(engine)
    greedy = hf_greedy(model, prompt, 12)
    assert engine.decode_plain(prompt, 12).tokens == greedy and len(steps) == 11  # the prefill gives the first
    steps.clear()
    eos = greedy[5]
    ends = greedy.index(eos)
    assert engine.decode_plain(prompt, 12, eos_ids=[eos]).tokens == greedy[:ends + 1]
    assert len(steps) == ends + (1 if overlap else 0)  # with overlap, the step in flight at the EOS ran too


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_the_cycle_in_flight_changes_no_token_and_no_statistic(shape):
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (17,), generator=torch.Generator().manual_seed(1)).tolist()
    greedy = hf_greedy(model, prompt, 48)
    runs = {}
    for overlap in (True, False):
        drafter = OracleDrafter(prompt + greedy, 320, wrong_every=3)
        engine = _engine(model, drafter, shape)
        engine.overlap = overlap
        runs[overlap] = engine.generate(prompt, 40, eos_ids=[greedy[30]])
        assert len(drafter.ingested) == 1 + len(runs[overlap].accepted) + (1 if overlap else 0)
    assert runs[True].tokens == runs[False].tokens == greedy[:greedy.index(greedy[30]) + 1]
    assert runs[True].accepted == runs[False].accepted and runs[True].drafted == runs[False].drafted


def test_host_reader_reads_each_slot_as_staged():
    from specdraft.decoding.host_reader import HostReader

    reader = HostReader(4, torch.device("cpu"))
    first = reader.stage(torch.tensor([3, 1, 4]))
    second = reader.stage(torch.tensor([1, 5, 9, 2]))
    assert first != second and reader.read(first, 3) == [3, 1, 4] and reader.read(second, 4) == [1, 5, 9, 2]
    assert reader.stage(torch.tensor([6])) == first  # a ring of two


def test_speculative_sampling_runs_and_stays_in_vocabulary():
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (9,)).tolist()
    drafter = OracleDrafter(prompt + hf_greedy(model, prompt, 48), 320)
    generator = torch.Generator().manual_seed(0)
    result = _engine(model, drafter, TreeShape(depth=3, topk=2, budget=7)).generate(
        prompt, 30, temperature=1.0, generator=generator, trace=True)
    assert len(result.tokens) == 30 and all(0 <= t < 320 for t in result.tokens)
    assert len(result.trace) == len(result.accepted) and result.trace[0]["accepted_nodes"][0] == 0


@pytest.mark.parametrize("shape", [TreeShape.chain(3), TreeShape(depth=3, topk=2, budget=7)])
def test_sampled_cycles_replayed_from_static_buffers_equal_eager_ones(monkeypatch, shape):
    """T > 0 with graphs on (a CPU stand-in with a CUDA graph's aliasing): the same draws as the eager cycles."""
    from specdraft.decoding import graphs
    from tests.runtime.replay import ReplayOnCpu

    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (9,)).tolist()
    drafter_tokens = prompt + hf_greedy(model, prompt, 48)
    runs = []
    for use_graphs in (False, True):
        monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)
        engine = _engine(model, OracleDrafter(drafter_tokens, 320), shape)
        engine.use_graphs = use_graphs
        runs.append(engine.generate(prompt, 30, temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert runs[1].tokens == runs[0].tokens and runs[1].accepted == runs[0].accepted


def test_a_sampling_shape_drafts_its_own_tree_at_t_above_zero_and_the_shape_at_zero():
    """An engine with a tree of its own for T > 0: greedy cycles verify `shape` and stay lossless; sampled ones
    draw exactly what an engine of that tree alone draws from the same seed."""
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    greedy = hf_greedy(model, prompt, 48)
    shape, sampling = TreeShape(depth=3, topk=3, budget=12), TreeShape(depth=2, topk=2, budget=5)
    both = SpecEngine(from_hf(model, TargetInfo.from_hf_config(model.config, "tiny")),
                      OracleDrafter(prompt + greedy, 320, wrong_every=3), shape, 256, hf_rope_tables(model, 256),
                      sampling_shape=sampling)
    assert both.generate(prompt, 30).tokens == greedy[:30] and both.verify_rows == shape.budget
    sampled = both.generate(prompt, 30, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert both.verify_rows == sampling.budget and max(sampled.accepted) <= sampling.depth
    alone = _engine(model, OracleDrafter(prompt + greedy, 320, wrong_every=3), sampling).generate(
        prompt, 30, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert sampled.tokens == alone.tokens and sampled.accepted == alone.accepted


def test_sampled_cycles_of_a_sampling_shape_replayed_from_static_buffers_equal_eager_ones(monkeypatch):
    """The sampling shape's cycles at T > 0 and the shape's at T=0, graphed (a CPU stand-in with a CUDA graph's
    aliasing) in one engine: the eager tokens of each."""
    from specdraft.decoding import graphs
    from tests.runtime.replay import ReplayOnCpu

    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (9,)).tolist()
    drafter_tokens = prompt + hf_greedy(model, prompt, 48)
    runs = []
    for use_graphs in (False, True):
        engine = SpecEngine(from_hf(model, TargetInfo.from_hf_config(model.config, "tiny")),
                            OracleDrafter(drafter_tokens, 320, wrong_every=3), TreeShape(3, 3, 12), 256,
                            hf_rope_tables(model, 256), use_graphs, sampling_shape=TreeShape(2, 2, 5))
        runs.append([engine.generate(prompt, 24, temperature=t, generator=torch.Generator().manual_seed(0))
                     for t in (1.0, 0.0, 1.0)])
    assert [r.tokens for r in runs[1]] == [r.tokens for r in runs[0]]
    assert [r.accepted for r in runs[1]] == [r.accepted for r in runs[0]]


def test_a_sampling_shape_for_a_chain_is_refused():
    from specdraft.core.errors import SpecdraftError

    model = tiny_hf("llama")
    with pytest.raises(SpecdraftError, match="fixed tree"):
        SpecEngine(from_hf(model, TargetInfo.from_hf_config(model.config, "tiny")), OracleDrafter([1, 2], 320),
                   TreeShape.chain(3), 64, hf_rope_tables(model, 64), sampling_shape=TreeShape(2, 2, 5))


def test_prompt_longer_than_the_cache_is_a_clear_error():
    from specdraft.core.errors import SpecdraftError

    engine = _engine(tiny_hf("llama"), max_len=64)
    with pytest.raises(SpecdraftError, match="cache"):
        engine.decode_plain(list(range(60)), 10)


@pytest.mark.triton_kernels
def test_a_short_generation_through_the_triton_kernels_is_lossless():
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (6,), generator=torch.Generator().manual_seed(2)).tolist()
    greedy = hf_greedy(model, prompt, 16)
    drafter = OracleDrafter(prompt + greedy, 320, wrong_every=3)
    result = _engine(model, drafter, TreeShape(depth=2, topk=2, budget=4), max_len=32).generate(prompt, 8)
    assert result.tokens == greedy[:8]


@pytest.mark.triton_kernels
@pytest.mark.parametrize("shape", [TreeShape.chain(3), TreeShape(depth=3, topk=2, budget=7)], ids=["chain", "tree"])
def test_sampled_cycles_through_the_triton_kernels_draw_the_references_tokens(monkeypatch, shape):
    """T > 0 with sampled drafts: the Triton kernels (sampled children, rejection sampling) draw the references'
    tokens from the same seed (they could differ only where float rounding decides a draw)."""
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (6,), generator=torch.Generator().manual_seed(2)).tolist()
    drafter_tokens = prompt + hf_greedy(model, prompt, 24)
    runs = []
    for kernels in ("reference", "auto"):
        monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
        engine = _engine(model, OracleDrafter(drafter_tokens, 320, wrong_every=3), shape, max_len=48)
        runs.append(engine.generate(prompt, 12, temperature=0.3, generator=torch.Generator().manual_seed(0)))
    assert runs[1].tokens == runs[0].tokens and runs[1].accepted == runs[0].accepted
    assert sum(runs[0].accepted) > 0

def test_a_tree_wider_than_the_attention_kernel_is_warned_of(caplog):
    """The verify's nodes and the draft's scratch slots fit the tree-attention kernel's window, or a warning
    names the shape: beyond it attention runs the reference, far slower (depth 8, top-8: 65 scratch slots)."""
    with caplog.at_level(logging.WARNING, logger="specdraft.decoding.shapes"):
        TreeShape(depth=5, topk=8, budget=40).validated()
        TreeShape.chain(6).validated()
        assert not caplog.records
        TreeShape(depth=8, topk=8, budget=64).validated()
    assert "65 scratch slots" in caplog.text and "<= 64" in caplog.text


class OneDraftCycle(CycleKind):
    """A cycle kind written against specdraft/decoding/cycles/base.py alone: one drafter call, its top-1 token after
    the root, verified with the root as a chain of two nodes."""

    most_tokens = 2

    def __init__(self, context, shape):
        self.context = context
        index = torch.arange(2, device=context.device)
        self.parents, self.depths, self.causal = index - 1, index, index[:, None] >= index[None, :]
        self.valid = torch.ones(2, dtype=torch.bool, device=context.device)

    def body(self, acceptance, randomness=None):
        context = self.context
        logits, _ = context.drafter.first(context.root, context.prefix_len)  # [1, Vd]
        scores, ids = draft_topk(logits, context.d2t, 1)  # [1, 1] each
        tree = DraftTree(tokens=torch.cat([context.root, ids[0]]), parents=self.parents, depths=self.depths,
                         valid=self.valid, tree_mask=self.causal, joint_logprobs=torch.cat([scores.new_zeros(1),
                                                                                           scores[0]]))
        return context.accept_and_commit(acceptance, tree, context.verify(tree, start_layer=0), 1, randomness)

    def run(self, acceptance, generator):
        randomness = acceptance.randomness(2, generator, self.context.device)
        out = self.context.graphed(f"one-draft:{acceptance.key}", partial(self.body, acceptance),
                                   *(() if randomness is None else (randomness,)))
        return CycleRun(out, 1)


@pytest.mark.parametrize("use_graphs", [False, True])
def test_a_cycle_kind_of_its_own_runs_through_the_engine_unchanged(monkeypatch, use_graphs):
    """A new kind (one module against the interface, EngineOptions.cycle_kind) decodes the target's greedy output,
    each cycle accepting its one draft from a perfect drafter; graphed (a CPU stand-in with a graph's aliasing) as
    eager."""
    from specdraft.decoding import graphs
    from tests.runtime.replay import ReplayOnCpu

    monkeypatch.setattr(graphs, "CallGraph", ReplayOnCpu)
    model = tiny_hf("llama")
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    greedy = hf_greedy(model, prompt, 24)
    engine = SpecEngine(from_hf(model, TargetInfo.from_hf_config(model.config, "tiny")),
                        OracleDrafter(prompt + greedy, 320), TreeShape.chain(1), 128, hf_rope_tables(model, 128),
                        use_graphs, cycle_kind=OneDraftCycle)
    result = engine.generate(prompt, 20)
    assert result.tokens == greedy[:20] and set(result.accepted[:-1]) == {1} and set(result.drafted) == {1}
