"""Every method's runtime drafter, on a tiny random target (CPU, fp32): it drafts exactly what the method's
training-side chain drafter (`spec.propose`) drafts, cycle after cycle; speculative decoding with it equals
greedy decoding for chains and trees; ingesting the prefix in pieces changes nothing."""
import functools

import pytest
import torch

from specdraft.methods import METHODS
from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures, TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.decoding.tree import TreeShape, build_tree
from specdraft.targets import capture_features
from specdraft.testing.tiny import tiny_llama_config
from tests.addons import DRAFT_METHODS
from tests.oracles import ChainState, chain_of

CASES = {  # random drafts with large enough weights to draft varied tokens
    "eagle3": {"draft_vocab_size": 200, "init_std": 0.3, "ttt_steps": 4},
    "poss": {"draft_vocab_size": 200, "init_std": 0.3, "ttt_steps": 4, "num_specialists": 3,
             "positions_per_specialist": 1},
    "kangaroo": {"draft_vocab_size": 200, "init_std": 0.3, "exit_layer": 2},
    "vispec": {"draft_vocab_size": 200, "init_std": 0.3, "ttt_steps": 4},  # text prompts: tests/test_vispec.py has images
    "peagle": {"draft_vocab_size": 200, "init_std": 0.3, "num_depths": 5},
    "dflash": {"block_size": 6, "num_layers": 2, "init_std": 0.3, "num_anchors": 16},
}
VARIANTS = {"eagle3.1": ("eagle3", {**CASES["eagle3"], "fc_norm": True, "norm_output": True})}
"""Recipe switches of a method whose drafter runs another path (EAGLE-3.1's normed features and fed-back state)."""
RUNTIME_METHODS = sorted(name for name in DRAFT_METHODS if METHODS[name].runtime is not None)
"""Drafts of their own; an add-on's drafter extends its base's (tests/test_methods_contract.py decodes with it)."""


@pytest.fixture(autouse=True)
def _reference_kernels(monkeypatch):
    """The plain PyTorch kernels: these tests are about the methods (tests/kernels/ checks the Triton ones,
    which the CPU would only interpret, slowly)."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "reference")


def test_every_method_has_a_runtime_and_a_case():
    assert RUNTIME_METHODS == DRAFT_METHODS and set(CASES) == set(DRAFT_METHODS)


def _hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _memorise(spec, cfg, draft, model, sequence, steps=20):
    """Optimizer steps on one sequence the target will produce, so that drafts there get accepted."""
    ids, ones = sequence[None], torch.ones_like(sequence[None])
    feats = capture_features(model, ids, ones, spec.feature_layers(cfg, _info(model)))
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    with torch.enable_grad():
        for _ in range(steps):
            loss = spec.loss(draft, DraftBatch(ids, ones, ones, feats), cfg).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def _info(model):
    return TargetInfo.from_hf_config(model.config, "tiny")


PROMPT = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(3)).tolist()


@functools.lru_cache(maxsize=None)
def _trained(method):
    """A tiny random target and the method's draft, trained on the target's own continuation of PROMPT."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # a peaked, repetitive target
    method, settings = VARIANTS.get(method, (method, CASES.get(method)))
    info, spec = _info(model), METHODS[method]
    cfg = spec.config(**settings)
    sequence = torch.tensor(PROMPT + _hf_greedy(model, PROMPT, 40))
    counts = torch.randint(0, 50, (info.vocab_size,)) + 1000 * torch.bincount(sequence, minlength=info.vocab_size)
    draft = spec.build(cfg, DraftContext(info, counts))
    if spec.bind_target is not None:
        spec.bind_target(draft, model)
    _memorise(spec, cfg, draft, model, sequence)
    return model, spec, cfg, draft.eval()


def _setup(method, shape):
    model, spec, cfg, draft = _trained(method)
    target = from_hf(model, _info(model))
    engine = SpecEngine(target, spec.runtime(draft, cfg, target), shape, 256, hf_rope_tables(model, 256))
    return model, spec, draft, engine


def _propose(model, spec, draft, confirmed, k):
    tokens = torch.tensor([confirmed])
    out = model(tokens[:, :-1], output_hidden_states=True)
    features = TargetFeatures(hidden_states={i: h for i, h in enumerate(out.hidden_states)})
    state = ChainState(tokens=tokens, features=features, embed=model.get_input_embeddings(),
                       lm_head=model.get_output_embeddings().weight)
    return chain_of(spec.name)(draft, state, k).tolist()


@pytest.mark.parametrize("method", RUNTIME_METHODS + sorted(VARIANTS))
@torch.no_grad()
def test_chain_drafts_equal_the_training_side_drafter(method):
    model, spec, draft, engine = _setup(method, TreeShape.chain(4))
    prompt = PROMPT
    result = engine.generate(prompt, 24, trace=True)
    generated, emitted = result.tokens, 1
    for cycle, row in enumerate(result.trace):
        confirmed = prompt + generated[:emitted]
        assert row["tokens"][0] == confirmed[-1]
        assert row["tokens"][1:] == _propose(model, spec, draft, confirmed, 4), f"cycle {cycle}"
        emitted += result.accepted[cycle] + 1
    assert sum(result.accepted) > 0  # the comparison covered multi-token ingests, not only first drafts


@pytest.mark.parametrize("method", RUNTIME_METHODS + sorted(VARIANTS))
@pytest.mark.parametrize("shape", [TreeShape.chain(5), TreeShape(depth=4, topk=3, budget=10)],
                         ids=["chain", "tree"])
@torch.no_grad()
def test_speculative_decoding_is_lossless(method, shape):
    model, _, _, engine = _setup(method, shape)
    prompts = (PROMPT, PROMPT[3:] + PROMPT[:3]) if shape.topk == 1 else (PROMPT,)  # learnt, and not learnt
    for prompt in prompts:
        result = engine.generate(prompt, 24)
        assert result.tokens == _hf_greedy(model, prompt, 24)


@pytest.mark.parametrize("method", RUNTIME_METHODS)
@pytest.mark.parametrize("shape", [TreeShape.chain(3), TreeShape(depth=3, topk=2, budget=6)], ids=["chain", "tree"])
@torch.no_grad()
def test_a_padded_prefill_changes_nothing(method, shape):
    """The prefill as CUDA graphs run it (the prompt padded to a multiple of `prefill_rows`), eagerly: the same
    answers, drafts and acceptances as the prompt's own length, for prompts below, at and past a multiple."""
    model, _, _, engine = _setup(method, shape)
    for length in (7, 8, 9, len(PROMPT)):
        prompt = PROMPT[:length]
        engine.prefill_rows = 1
        exact = engine.generate(prompt, 12, trace=True)
        engine.prefill_rows = 8
        padded = engine.generate(prompt, 12, trace=True)
        assert padded.tokens == exact.tokens == _hf_greedy(model, prompt, 12)
        assert padded.accepted == exact.accepted
        for got, expected in zip(padded.trace, exact.trace):  # log-probabilities: other matmul shapes, other sums
            assert got["draft_logprobs"] == pytest.approx(expected["draft_logprobs"], abs=1e-4)
            assert {**got, "draft_logprobs": None} == {**expected, "draft_logprobs": None}


@pytest.mark.parametrize("method", RUNTIME_METHODS)
@torch.no_grad()
def test_ingesting_in_pieces_equals_ingesting_at_once(method):
    _, _, _, engine = _setup(method, TreeShape(depth=3, topk=2, budget=6))
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
        model, _, _, engine = _setup(method, TreeShape(depth=2, topk=2, budget=4))
        runs[kernels] = engine.generate(PROMPT, 6, trace=True)
    assert [row["tokens"] for row in runs["auto"].trace] == [row["tokens"] for row in runs["reference"].trace]
    assert runs["auto"].tokens == runs["reference"].tokens == _hf_greedy(model, PROMPT, 6)
