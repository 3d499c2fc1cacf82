"""Every target family the verifier runs (decoding/verifier/families/), on tiny random models built here from
transformers' own config classes, float32 on the CPU: the verifier's logits are Hugging Face's (a prompt's
prefill, then one token at a time, well past every sliding window), plain decoding is HF greedy `generate`,
speculative decoding (chain and tree; a random EAGLE-3 draft and a drafter that knows the answer) is plain
decoding token for token, a T = 1 cycle's first token follows the target's distribution, and distill-data's
static engine answers as HF greedy `generate` does. The models (specdraft/testing/families.py) mix what the
families differ in: sliding windows of 8 tokens, q/k norms, Gemma 3's norms, activation, scales and two rotary
bases, routed experts."""
from __future__ import annotations

import pytest
import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.decoding.batched import batched_generator, unsupported_reason
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.verifier import from_hf, hf_rope_tables, quantized_verifier
from specdraft.methods.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Drafter
from specdraft.testing.families import FAMILIES, VOCAB, WINDOW, family_config, tiny_family
from tests.runtime.oracle import OracleDrafter
from tests.runtime.sampled_cycles import first_tokens
from tests.runtime.sampled_cycles import CRITICAL, chi_square_top

pytestmark = [pytest.mark.reference_kernels, pytest.mark.usefixtures("one_thread")]

CHAIN, TREE = TreeShape.chain(4), TreeShape(depth=4, topk=2, budget=10)


def info_of(model) -> TargetInfo:
    return TargetInfo.from_hf_config(model.config, "tiny")


def engine_for(model, drafter_of=None, shape=CHAIN, max_len=256) -> SpecEngine:
    target = from_hf(model, info_of(model))
    drafter = drafter_of(target) if drafter_of is not None else None
    return SpecEngine(target, drafter, shape, max_len, hf_rope_tables(model, max_len))


def eagle3_drafter(model):
    """A random EAGLE-3 draft of the model's geometry (on its device) -> a function target -> its runtime
    drafter."""
    info = info_of(model)
    torch.manual_seed(1)
    draft = Eagle3Draft(Eagle3Config(draft_vocab_size=200, init_std=0.3),
                        DraftContext(info, torch.randint(0, 50, (info.vocab_size,)))).eval().to(model.device)
    return lambda target: Eagle3Drafter(draft, target)


def hf_greedy(model, prompt, new_tokens):
    """HF greedy; the attention mask given, since generate would mask a prompt's pad-id tokens out otherwise."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompt_of(length: int, seed: int = 0):
    return torch.randint(0, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_the_verifiers_logits_are_hugging_faces(family):
    """A 20-token prompt's prefill, then 16 tokens one at a time (plain decoding's step), against HF's forward over
    the whole sequence: every position, past every window."""
    model = tiny_family(family)
    sequence = torch.tensor(prompt_of(36, seed=2))
    expected = model(sequence[None]).logits[0]  # [36, V]
    engine = engine_for(model)
    target = engine.target
    hidden, _ = target.run_layers(target.embed(sequence[:20]), torch.arange(20), engine.prefix_len, None)
    torch.testing.assert_close(target.logits(hidden), expected[:20], atol=1e-4, rtol=1e-4)
    engine.prefix_len.fill_(20)
    steps = torch.stack([engine.plain_step(sequence[i:i + 1])[0] for i in range(20, 36)])
    torch.testing.assert_close(steps, expected[20:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["mistral", "gemma3", "qwen3_moe"])
@torch.no_grad()
def test_the_windows_matter(family):
    """The same weights with every window dropped give other logits past the window: the tests above can fail."""
    model = tiny_family(family)
    sequence = torch.tensor(prompt_of(30, seed=3))
    windowed = model(sequence[None]).logits[0]
    model.config.sliding_window = 1024  # longer than the sequence (Gemma 3's cache wants a number)
    for layer in model.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = 1024
    full = model(sequence[None]).logits[0]
    assert torch.allclose(windowed[:WINDOW], full[:WINDOW], atol=1e-5)
    assert not torch.allclose(windowed[WINDOW:], full[WINDOW:], atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_plain_decoding_is_hf_greedy(family):
    model = tiny_family(family)
    prompt = prompt_of(12, seed=4)
    assert engine_for(model).decode_plain(prompt, 40).tokens == hf_greedy(model, prompt, 40)


@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_speculative_decoding_is_plain_decoding(family, shape):
    """A random EAGLE-3 draft (its features read from the family's layers), and a drafter that drafts the
    target's own continuation with a wrong token every third position (long accepted paths: tree verifies past
    the windows): each gives plain decoding's tokens."""
    model = tiny_family(family)
    prompt = prompt_of(14, seed=5)
    plain = engine_for(model).decode_plain(prompt, 36).tokens
    got = engine_for(model, eagle3_drafter(model), shape).generate(prompt, 36)
    assert got.tokens == plain
    oracle = engine_for(model, lambda target: OracleDrafter(prompt + plain, VOCAB, wrong_every=3), shape)
    result = oracle.generate(prompt, 36)
    assert result.tokens == plain
    assert max(result.accepted) >= 2  # paths of several drafted tokens were verified and kept


@pytest.mark.parametrize("family", ["gemma3", pytest.param("qwen3_moe", marks=pytest.mark.slow)])
@torch.no_grad()
def test_sampled_cycles_keep_the_target_distribution(family):
    """T = 1 (sampled drafts from a random EAGLE-3 draft, a tree): a cycle's first token follows the target's
    distribution after a prompt longer than the window (the chi-square the runtime's suites use)."""
    model = tiny_family(family)
    with torch.no_grad():
        model.lm_head.weight.div_(4.0)  # a spread distribution: several likely tokens
    prompt = prompt_of(16, seed=6)
    engine = engine_for(model, eagle3_drafter(model), TREE)
    root, firsts = first_tokens(engine, prompt, 400)
    probs = torch.softmax(model(torch.tensor([prompt + [root]])).logits[0, -1], -1)  # [V]
    assert chi_square_top(firsts, probs) < CRITICAL


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_the_static_engine_answers_as_hf_greedy(family):
    """distill-data's static engine: 7 prompts of 1-24 tokens through 3 rows (refilled as answers end), 14 new
    tokens each, prompts and answers past the window."""
    model = tiny_family(family)
    info = info_of(model)
    assert unsupported_reason(model, info, 512) is None
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 300, (int(n),), generator=generator).tolist()
               for n in torch.randint(1, 25, (7,), generator=generator)]
    expected = [hf_greedy(model, prompt, 14) for prompt in prompts]
    assert batched_generator(model, info, 3).generate(prompts, 14) == expected


@pytest.mark.parametrize("family", ["gemma3", "qwen3_moe"])
@torch.no_grad()
def test_the_triton_kernels_give_the_references_tokens(monkeypatch, family):
    """The interpreted Triton kernels (tree attention with windows, grouped experts, the norms and rope) through
    the verifier: plain and speculative decoding give the references' tokens."""
    model = tiny_family(family)
    prompt = prompt_of(12, seed=8)
    expected = engine_for(model).decode_plain(prompt, 14).tokens
    monkeypatch.setenv("SPECDRAFT_KERNELS", "auto")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert engine_for(model).decode_plain(prompt, 14).tokens == expected
    oracle = engine_for(model, lambda target: OracleDrafter(prompt + expected, VOCAB, wrong_every=4), TREE)
    assert oracle.generate(prompt, 14).tokens == expected


def test_an_unknown_family_is_a_one_line_error():
    model = tiny_family("llama")
    info = TargetInfo.from_dict({**info_of(model).to_dict(), "model_type": "phi3"})
    with pytest.raises(SpecdraftError) as caught:
        from_hf(model, info)
    message = str(caught.value)
    assert "\n" not in message and "'phi3'" in message
    assert all(name in message for name in ("llama", "qwen3", "gemma3_text", "qwen3_moe", "mixtral"))
    assert "phi3" in unsupported_reason(model, info, 512)


def test_what_a_family_cannot_run_is_a_one_line_error():
    """Gemma 2's attention-logit softcapping on a Gemma 3 config; a mixture-of-experts target quantized."""
    model_class, config = family_config("gemma3")
    config.attn_logit_softcapping = 50.0
    model = model_class(config).eval()
    with pytest.raises(SpecdraftError, match=r"^the runtime cannot run target tiny \(gemma3_text\): attention logit "
                                             r"softcapping \(50.0\)$"):
        from_hf(model, info_of(model))
    assert unsupported_reason(model, info_of(model), 512) == "attention logit softcapping (50.0)"
    moe = tiny_family("mixtral")
    with pytest.raises(SpecdraftError, match="runs dense targets alone"):
        quantized_verifier(from_hf(moe, info_of(moe)), "int8")
    from specdraft.layers.quantized import quantize_decoder

    quantize_decoder(moe, "int8")
    with pytest.raises(SpecdraftError, match="mixture-of-experts model.*runs dense targets alone"):
        from_hf(moe, info_of(moe))
    assert "mixture-of-experts" in unsupported_reason(moe, info_of(moe), 512)


@torch.no_grad()
def test_a_quantized_family_verifier_keeps_its_norms_and_scales():
    """quantized_verifier of a Gemma 3 verifier: its own norms (1 + w, float32), embedding scale and rotary kinds
    carried over; its greedy tokens are those of the float verifier's weights rounded to int8."""
    model = tiny_family("gemma3")
    target = from_hf(model, info_of(model))
    quantized = quantized_verifier(target, "int8")
    assert quantized.embed_scale.item() == target.embed_scale.item()
    assert torch.equal(quantized.layers[0].post_mlp_norm, target.layers[0].post_mlp_norm)
    assert quantized.layers[0].q_norm.dtype == torch.float32
    engine = SpecEngine(quantized, None, CHAIN, 128, hf_rope_tables(model, 128))
    plain = engine.decode_plain(prompt_of(12, seed=9), 8).tokens
    assert len(plain) == 8


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_cuda_graphs_on_a_gpu_give_the_eager_tokens(monkeypatch, family, shape):
    """On a GPU (Triton kernels, CUDA graphs), float32: plain decoding is HF greedy, the graphed speculative
    engine is the eager one, and the static engine's graphed steps answer as HF does."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "auto")
    model = tiny_family(family).cuda()
    prompt = prompt_of(30, seed=10)
    expected = hf_greedy(model, prompt, 40)
    drafter = eagle3_drafter(model)

    def engine(use_graphs):
        target = from_hf(model, info_of(model))
        return SpecEngine(target, drafter(target), shape, 256, hf_rope_tables(model, 256), use_graphs)
    graphed, eager = engine(True), engine(False)
    assert graphed.use_graphs
    eager.prefill_rows = graphed.prefill_rows
    assert graphed.decode_plain(prompt, 40).tokens == expected
    for _ in range(2):  # the second run replays the captured graphs
        assert graphed.generate(prompt, 40).tokens == eager.generate(prompt, 40).tokens == expected
    prompts = [prompt_of(n, seed=n) for n in (3, 17, 29, 40)]
    answers = batched_generator(model, info_of(model), 4).generate(prompts, 20)
    assert answers == [hf_greedy(model, p, 20) for p in prompts]
