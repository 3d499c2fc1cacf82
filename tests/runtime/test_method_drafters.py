"""Every method's runtime drafter, on a tiny random target (CPU, fp32): it drafts exactly what the method's
training-side chain drafter (`spec.propose`) drafts, cycle after cycle; speculative decoding with it equals
greedy decoding for chains and trees; ingesting the prefix in pieces changes nothing."""
import pytest
import torch

from specdraft.methods import METHODS
from specdraft.decoding.tree import TreeShape, build_tree
from tests.addons import DRAFT_METHODS
from tests.runtime.drafts import CASES, PROMPT, VARIANTS, hf_greedy, trained_engine, training_side_chain

pytestmark = pytest.mark.reference_kernels

RUNTIME_METHODS = sorted(name for name in DRAFT_METHODS if METHODS[name].runtime is not None)
"""Drafts of their own; an add-on's drafter extends its base's (tests/test_methods_contract.py decodes with it)."""


def test_every_method_has_a_runtime_and_a_case():
    assert RUNTIME_METHODS == DRAFT_METHODS and set(CASES) == set(DRAFT_METHODS)


@pytest.mark.parametrize("method", RUNTIME_METHODS + sorted(VARIANTS))
@torch.no_grad()
def test_chain_drafts_equal_the_training_side_drafter(method):
    model, spec, draft, engine = trained_engine(method, TreeShape.chain(4))
    prompt = PROMPT
    result = engine.generate(prompt, 24, trace=True)
    generated, emitted = result.tokens, 1
    for cycle, row in enumerate(result.trace):
        confirmed = prompt + generated[:emitted]
        assert row["tokens"][0] == confirmed[-1]
        assert row["tokens"][1:] == training_side_chain(model, spec, draft, confirmed, 4), f"cycle {cycle}"
        emitted += result.accepted[cycle] + 1
    assert sum(result.accepted) > 0  # the comparison covered multi-token ingests, not only first drafts


@pytest.mark.parametrize("method", RUNTIME_METHODS + sorted(VARIANTS))
@pytest.mark.parametrize("shape", [TreeShape.chain(5), TreeShape(depth=4, topk=3, budget=10)],
                         ids=["chain", "tree"])
@torch.no_grad()
def test_speculative_decoding_is_lossless(method, shape):
    model, _, _, engine = trained_engine(method, shape)
    prompts = (PROMPT, PROMPT[3:] + PROMPT[:3]) if shape.topk == 1 else (PROMPT,)  # learnt, and not learnt
    for prompt in prompts:
        result = engine.generate(prompt, 24)
        assert result.tokens == hf_greedy(model, prompt, 24)


@pytest.mark.parametrize("method", RUNTIME_METHODS)
@pytest.mark.parametrize("shape", [TreeShape.chain(3), TreeShape(depth=3, topk=2, budget=6)], ids=["chain", "tree"])
@torch.no_grad()
def test_a_padded_prefill_changes_nothing(method, shape):
    """The prefill as CUDA graphs run it (the prompt padded to a multiple of `prefill_rows`), eagerly: the same
    answers, drafts and acceptances as the prompt's own length, for prompts below, at and past a multiple."""
    model, _, _, engine = trained_engine(method, shape)
    for length in (7, 8, 9, len(PROMPT)):
        prompt = PROMPT[:length]
        engine.prefill_rows = 1
        exact = engine.generate(prompt, 12, trace=True)
        engine.prefill_rows = 8
        padded = engine.generate(prompt, 12, trace=True)
        assert padded.tokens == exact.tokens == hf_greedy(model, prompt, 12)
        assert padded.accepted == exact.accepted
        for got, expected in zip(padded.trace, exact.trace):  # log-probabilities: other matmul shapes, other sums
            assert got["draft_logprobs"] == pytest.approx(expected["draft_logprobs"], abs=1e-4)
            assert {**got, "draft_logprobs": None} == {**expected, "draft_logprobs": None}


@pytest.mark.parametrize("method", RUNTIME_METHODS)
@torch.no_grad()
def test_ingesting_in_pieces_equals_ingesting_at_once(method):
    _, _, _, engine = trained_engine(method, TreeShape(depth=3, topk=2, budget=6))
    prompt = torch.tensor(torch.randint(0, 300, (12,)).tolist())
    engine.prefill(prompt, 0.0)
    drafter = engine.drafter

    def drafts():  # a block drafter's proposals, else the tree the drafter drafts
        if drafter.caps.block_size:
            return drafter.propose(engine.root, engine.prefix_len).clone()
        return build_tree(drafter, engine.shape, engine.root, engine.prefix_len).tokens.clone()

    whole = drafts()
    _, captured = engine.target.run_layers(engine.target.embed(prompt), torch.arange(12),
                                           torch.zeros(1, dtype=torch.long), None, capture=drafter.feature_layers)
    next_tokens = torch.cat([prompt[1:], engine.root])
    for start, stop in ((0, 5), (5, 6), (6, 12)):  # padded to 8 rows, as the engine pads
        rows = torch.arange(start, start + 8).clamp(max=11)
        drafter.ingest({i: h[rows] for i, h in captured.items()}, next_tokens[rows], torch.tensor([start]),
                       torch.tensor([stop - start]))
    pieces = drafts()
    if drafter.caps.block_size:  # logits: padded rows are other matmul shapes, other sums on some CPUs
        torch.testing.assert_close(pieces, whole, rtol=1e-5, atol=1e-5)
        assert torch.equal(pieces.argmax(-1), whole.argmax(-1))
    else:
        assert torch.equal(pieces, whole)


@pytest.mark.triton_kernels
@pytest.mark.parametrize("method", RUNTIME_METHODS)
@torch.no_grad()
def test_drafts_through_the_triton_kernels_equal_the_references(method, monkeypatch):
    """The drafters' fused launches (rms_norm, rope_cache over their rope tables, silu_mul; the interpreter here)
    draft the trees the references draft, and the output stays the target's greedy output."""
    runs = {}
    for kernels in ("reference", "auto"):
        monkeypatch.setenv("SPECDRAFT_KERNELS", kernels)
        model, _, _, engine = trained_engine(method, TreeShape(depth=2, topk=2, budget=4))
        runs[kernels] = engine.generate(PROMPT, 6, trace=True)
    assert [row["tokens"] for row in runs["auto"].trace] == [row["tokens"] for row in runs["reference"].trace]
    assert runs["auto"].tokens == runs["reference"].tokens == hf_greedy(model, PROMPT, 6)
