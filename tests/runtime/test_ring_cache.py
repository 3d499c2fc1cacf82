"""The ring cache of a windowed draft (method.attention_window, LongSpec) in the runtime, CPU, float32, on a tiny
random target: EAGLE-3's and PosS's drafters draft what the training-side drafter (the windowed TTT layers) drafts
while the ring wraps; speculative decoding stays lossless; with the window covering the context the ring drafts
what the full cache drafts; ingesting in pieces changes nothing; its memory is the same at any max_len."""
import functools

import pytest
import torch

from specdraft.core.types import DraftContext
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.tree import TreeShape, build_tree
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.layers.draft_cache import RingLayout, ring_commit
from specdraft.methods import METHODS
from specdraft.testing.tiny import tiny_llama_config
from tests.runtime.drafts import CASES, PROMPT, hf_greedy, memorise, target_info, training_side_chain

pytestmark = pytest.mark.reference_kernels

WINDOWED = ("eagle3", "poss")


@functools.lru_cache(maxsize=None)
def _trained(method, window, sinks):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    info, spec = target_info(model), METHODS[method]
    cfg = spec.config(**CASES[method], attention_window=window, attention_sinks=sinks)
    sequence = torch.tensor(PROMPT + hf_greedy(model, PROMPT, 40))
    counts = torch.randint(0, 50, (info.vocab_size,)) + 1000 * torch.bincount(sequence, minlength=info.vocab_size)
    draft = spec.build(cfg, DraftContext(info, counts))
    memorise(spec, cfg, draft, model, sequence)
    return model, spec, cfg, draft.eval()


def _engine(method, shape, window=6, sinks=2, max_len=256):
    model, spec, cfg, draft = _trained(method, window, sinks)
    target = from_hf(model, target_info(model))
    return model, spec, draft, SpecEngine(target, spec.runtime(draft, cfg, target), shape, max_len,
                                          hf_rope_tables(model, max_len))


@pytest.mark.parametrize("method", WINDOWED)
@torch.no_grad()
def test_ring_drafts_equal_the_windowed_training_side_drafter(method):
    """Window 6 and 2 sinks over a 13-token prompt and 24 more: the ring wraps many times, and every cycle's
    chain is what the TTT layers (attending within their window) draft from the whole sequence."""
    model, spec, draft, engine = _engine(method, TreeShape.chain(4))
    assert engine.drafter.ring == RingLayout(sinks=2, window=6, scratch=engine.shape.scratch)
    result = engine.generate(PROMPT, 24, trace=True)
    generated, emitted = result.tokens, 1
    for cycle, row in enumerate(result.trace):
        confirmed = PROMPT + generated[:emitted]
        assert row["tokens"][1:] == training_side_chain(model, spec, draft, confirmed, 4), f"cycle {cycle}"
        emitted += result.accepted[cycle] + 1
    assert sum(result.accepted) > 0 and result.tokens == hf_greedy(model, PROMPT, 24)


@pytest.mark.parametrize("method", WINDOWED)
@pytest.mark.parametrize("shape", [TreeShape.chain(5), TreeShape(depth=4, topk=3, budget=10)], ids=["chain", "tree"])
@pytest.mark.parametrize("window, sinks", [(6, 2), (3, 0)])
@torch.no_grad()
def test_ring_decoding_is_lossless(method, shape, window, sinks):
    model, _, _, engine = _engine(method, shape, window, sinks)
    for prompt in (PROMPT, PROMPT[3:] + PROMPT[:3]):
        assert engine.generate(prompt, 24).tokens == hf_greedy(model, prompt, 24)


@pytest.mark.parametrize("method", WINDOWED)
@torch.no_grad()
def test_a_covering_ring_drafts_what_the_full_cache_drafts(method):
    """A window of 64 over a 13 + 20 token context never wraps: the ring's drafts and draft log-probabilities are
    the full cache's (the same draft served with window 0: whole-prefix attention)."""
    runs = []
    for window in (64, 0):
        model, spec, cfg, draft = _trained(method, 64, 4)
        served = spec.build(spec.config(**{**CASES[method], "attention_window": window}),
                            DraftContext(target_info(model), torch.ones(target_info(model).vocab_size)))
        served.load_state_dict(draft.state_dict())
        target = from_hf(model, target_info(model))
        engine = SpecEngine(target, spec.runtime(served.eval(), cfg, target), TreeShape(depth=3, topk=2, budget=6),
                            256, hf_rope_tables(model, 256))
        assert (engine.drafter.ring is None) == (window == 0)
        runs.append(engine.generate(PROMPT, 20, trace=True))
    ring, full = runs
    assert ring.tokens == full.tokens == hf_greedy(model, PROMPT, 20) and ring.accepted == full.accepted
    for got, want in zip(ring.trace, full.trace):
        assert got["tokens"] == want["tokens"]
        assert got["draft_logprobs"] == pytest.approx(want["draft_logprobs"], abs=1e-4)


@pytest.mark.parametrize("method", WINDOWED)
@torch.no_grad()
def test_ring_ingests_in_pieces_equal_one_ingest(method):
    _, _, _, engine = _engine(method, TreeShape(depth=3, topk=2, budget=6), window=4, sinks=1)
    prompt = torch.tensor(torch.randint(0, 300, (14,), generator=torch.Generator().manual_seed(5)).tolist())
    engine.prefill(prompt, 0.0)
    drafter = engine.drafter
    whole = build_tree(drafter, engine.shape, engine.root, engine.prefix_len).tokens.clone()
    _, captured = engine.target.run_layers(engine.target.embed(prompt), torch.arange(14),
                                           torch.zeros(1, dtype=torch.long), None, capture=drafter.feature_layers)
    next_tokens = torch.cat([prompt[1:], engine.root])
    for start, stop in ((0, 5), (5, 6), (6, 12), (12, 14)):  # padded to 8 rows, as the engine pads
        rows = torch.arange(start, start + 8).clamp(max=13)
        drafter.ingest({i: h[rows] for i, h in captured.items()}, next_tokens[rows], torch.tensor([start]),
                       torch.tensor([stop - start]))
    assert torch.equal(build_tree(drafter, engine.shape, engine.root, engine.prefix_len).tokens, whole)


@pytest.mark.parametrize("method", WINDOWED)
def test_the_draft_cache_is_the_same_size_at_any_context_length(method):
    model, spec, cfg, draft = _trained(method, 6, 2)
    target = from_hf(model, target_info(model))
    drafter = spec.runtime(draft, cfg, target)
    sizes = []
    for max_len in (64, 1024, 8192):
        drafter.allocate(max_len, 10, torch.device("cpu"), torch.float32)
        sizes.append(sum(t.numel() * t.element_size() for t in (drafter.k_cache, drafter.v_cache)))
    assert sizes[0] == sizes[1] == sizes[2]
    assert drafter.k_cache.shape[-2] == 2 + 6 + 10 + 1  # sinks, ring, scratch, trash
    drafter.allocate(8, 10, torch.device("cpu"), torch.float32)  # window and sinks cover max_len: a full cache
    assert drafter.ring is None and drafter.k_cache.shape[-2] == 8


def test_ring_layout_holds_the_newest_columns():
    """After columns 0..n-1 went in, in ingests of any size, the held slots hold the sinks and the `window`
    newest columns, each at its slot, and padding rows never overwrite one."""
    layout = RingLayout(sinks=2, window=5, scratch=3)
    k_cache = torch.full((1, layout.slots, 1), -1.0)
    v_cache = torch.zeros_like(k_cache)
    start = 0
    for count in (3, 1, 6, 2, 9, 4):
        rows = count + 3  # three padding rows
        columns = torch.arange(start, start + rows, dtype=torch.float32)
        columns[count:] = -7  # padding
        ring_commit(layout, k_cache, v_cache, columns.view(1, rows, 1), columns.view(1, rows, 1),
                    torch.tensor([start]), torch.tensor([count]))
        start += count
        held = layout.held_columns(torch.tensor([start]))
        expected = sorted({*range(min(2, start)), *range(max(2, start - 5), start)})
        assert sorted(c for c in held.tolist() if c >= 0) == expected
        for slot, column in enumerate(held.tolist()):
            if column >= 0:
                assert k_cache[0, slot, 0] == column
