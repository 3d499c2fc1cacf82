"""The static batched engine (decoding/batched.py) against Hugging Face `generate`, float32 on the CPU, on tiny
random Llama and Qwen2 targets built here: greedy answers identical for many prompts of mixed lengths, with rows
refilled as answers end (EOS or max_new_tokens), at any batch size; sampling by HF's temperature / top-p
distribution; a sliding window; and the targets it refuses to reproduce (tests/test_families_runtime.py: every
other family)."""
import pytest
import torch

from specdraft.core.types import TargetInfo
from specdraft.decoding.batched import batched_generator, unsupported_reason
from specdraft.decoding.sampling import sample_rows, top_p_filter
from specdraft.testing.tiny import tiny_llama_config, tiny_qwen2_config

pytestmark = [pytest.mark.reference_kernels, pytest.mark.usefixtures("one_thread")]


def tiny_model(family: str, seed: int = 0, **config_updates):
    """A tiny random causal LM in float32 with a peaked next-token distribution (no near ties)."""
    from transformers import AutoModelForCausalLM

    config = tiny_llama_config(layers=2) if family == "llama" else tiny_qwen2_config()
    for key, value in config_updates.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model


def mixed_prompts(count: int, seed: int = 1, longest: int = 40):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (count,), generator=generator).tolist()
    return [torch.randint(0, 250, (n,), generator=generator).tolist() for n in lengths]


def hf_greedy(model, prompts, max_new_tokens, eos_ids):
    """Hugging Face generate on the left-padded batch, each answer cut before its first EOS."""
    from specdraft.distill.run import cut_at_eos, left_pad

    input_ids, attention_mask = left_pad(prompts, 0, model.device)
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                            do_sample=False, eos_token_id=list(eos_ids) or None, pad_token_id=0)
    return [cut_at_eos(row, list(eos_ids)) for row in output[:, input_ids.shape[1]:].tolist()]


def generator_for(model, batch_size):
    return batched_generator(model, TargetInfo.from_hf_config(model.config, "tiny"), batch_size)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_answers_are_hf_greedy_answers(family):
    """15 prompts of 1-40 tokens through 4 rows: rows are refilled as answers end, on an EOS that the target
    does produce (taken from its own answers) or at max_new_tokens."""
    model = tiny_model(family)
    prompts = mixed_prompts(15)
    free_running = hf_greedy(model, prompts, 12, [])
    eos = free_running[0][4]  # a token the target emits: some answers end early, some never
    expected = hf_greedy(model, prompts, 12, [eos])
    assert any(len(answer) < 12 for answer in expected) and any(len(answer) == 12 for answer in expected)
    with torch.no_grad():
        got = generator_for(model, 4).generate(prompts, 12, eos_ids=[eos])
    assert got == expected


@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_any_batch_size_gives_the_same_answers(batch_size):
    model = tiny_model("llama", seed=1)
    prompts = mixed_prompts(7, seed=2, longest=20)
    assert generator_for(model, batch_size).generate(prompts, 6) == hf_greedy(model, prompts, 6, [])


def test_one_engine_serves_calls_of_growing_size():
    """A second call with more rows and longer prompts re-allocates the cache; max_new_tokens=1 is the prefill's
    token alone; an answer that starts with EOS is empty."""
    model = tiny_model("qwen2", seed=2)
    engine = generator_for(model, 8)
    short, long = mixed_prompts(3, seed=3, longest=5), mixed_prompts(9, seed=4, longest=300)
    assert engine.generate(short, 1) == hf_greedy(model, short, 1, [])
    first = hf_greedy(model, long, 1, [])[0][0]
    assert engine.generate(long, 5, eos_ids=[first]) == hf_greedy(model, long, 5, [first])
    assert engine.generate(long, 5, eos_ids=[first])[0] == [] and engine.decoder.rows == 8


def test_interpreted_kernels_end_to_end(monkeypatch):
    """The Triton kernels (rms_norm, rope_cache, silu_mul, ragged_attention) under the interpreter."""
    monkeypatch.setenv("SPECDRAFT_KERNELS", "auto")
    model = tiny_model("llama", seed=3, num_hidden_layers=1)
    prompts = mixed_prompts(3, seed=5, longest=12)
    assert generator_for(model, 2).generate(prompts, 3) == hf_greedy(model, prompts, 3, [])


def _hf_filtered(scores, temperature, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    return TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, scores))


@pytest.mark.parametrize("temperature, top_p", [(0.7, 0.9), (1.3, 0.5), (1.0, 1.0)])
def test_top_p_keeps_the_tokens_hf_keeps(temperature, top_p):
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(0)) * 3
    expected = _hf_filtered(logits.clone(), temperature, top_p)
    got = top_p_filter(logits / temperature, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(torch.softmax(got, -1), torch.softmax(expected, -1))


def test_sampled_tokens_follow_the_filtered_distribution():
    """20,000 draws of one row: each token's frequency within 4 standard errors of HF's probability, and the
    tokens top-p drops never drawn."""
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(1)) * 2
    probs = torch.softmax(_hf_filtered(logits.clone(), 0.8, 0.85), -1)[0]  # [V]
    draws = 20_000
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(2))
    tokens = sample_rows(logits.expand(draws, -1), 0.8, 0.85, uniforms)
    frequency = torch.bincount(tokens, minlength=12).double() / draws
    error = (probs * (1 - probs) / draws).sqrt().double()
    assert bool((frequency[probs == 0] == 0).all()) and int((probs > 0).sum()) > 2
    assert bool(((frequency - probs.double()).abs() <= 4 * error + 1e-9).all())


def test_sampling_is_seeded():
    model = tiny_model("llama", seed=4)
    engine = generator_for(model, 3)
    prompts = mixed_prompts(5, seed=6, longest=10)
    first = engine.generate(prompts, 8, temperature=1.0, top_p=0.9, seed=7)
    assert engine.generate(prompts, 8, temperature=1.0, top_p=0.9, seed=7) == first
    assert engine.generate(prompts, 8, temperature=1.0, top_p=0.9, seed=8) != first


@pytest.mark.parametrize("updates, reason", [
    ({}, None),
    ({"mlp_bias": True}, "biases on o_proj or the MLP"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
])
def test_what_the_static_engine_reproduces(updates, reason):
    model = tiny_model("llama", **updates)
    got = unsupported_reason(model, TargetInfo.from_hf_config(model.config, "tiny"), 512)
    assert got == reason if reason is None else reason in got


def test_a_sliding_window_shorter_than_the_sequences_is_honoured():
    """Mistral with an 8-token window, prompts and answers well past it: HF's greedy answers, which full
    attention would not give."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    torch.manual_seed(3)
    model = MistralForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    info = TargetInfo.from_hf_config(config, "tiny")
    assert unsupported_reason(model, info, 512) is None
    prompts = mixed_prompts(6, seed=4, longest=30)
    expected = hf_greedy(model, prompts, 16, [])
    with torch.no_grad():
        assert generator_for(model, 4).generate(prompts, 16) == expected
    model.config.sliding_window = None  # the same weights with full attention answer otherwise
    assert hf_greedy(model, prompts, 16, []) != expected


@pytest.mark.gpu
def test_graphed_steps_on_a_gpu_match_hf_in_float32():
    model = tiny_model("qwen2", seed=5).cuda()
    prompts = mixed_prompts(40, seed=7, longest=100)
    engine = generator_for(model, 16)
    assert engine.decoder.use_graphs
    assert engine.generate(prompts, 20) == hf_greedy(model, prompts, 20, [])
