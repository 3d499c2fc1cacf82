"""The tiny random targets and trained drafts the runtime's tests share (CPU, float32): every method's draft
trained on a peaked target's own continuation of PROMPT, that target's Hugging Face greedy tokens, and the
training-side chain drafter a runtime drafter must match."""
import functools

import torch

from specdraft.core.types import DraftBatch, DraftContext, TargetFeatures, TargetInfo
from specdraft.decoding.engine import SpecEngine
from specdraft.decoding.verifier import from_hf, hf_rope_tables
from specdraft.methods import METHODS
from specdraft.targets import capture_features
from specdraft.testing.tiny import tiny_llama_config
from tests.oracles import ChainState, chain_of

CASES = {  # random drafts with large enough weights to draft varied tokens
    "eagle3": {"draft_vocab_size": 200, "init_std": 0.3, "ttt_steps": 4},
    "poss": {"draft_vocab_size": 200, "init_std": 0.3, "ttt_steps": 4, "num_specialists": 3,
             "positions_per_specialist": 1},
    "kangaroo": {"draft_vocab_size": 200, "init_std": 0.3, "exit_layer": 2},
    "vispec": {"draft_vocab_size": 200, "init_std": 0.3, "ttt_steps": 4},  # text prompts (tests/test_vispec.py: images)
    "peagle": {"draft_vocab_size": 200, "init_std": 0.3, "num_depths": 5},
    "dflash": {"block_size": 6, "num_layers": 2, "init_std": 0.3, "num_anchors": 16},
}
VARIANTS = {"eagle3.1": ("eagle3", {**CASES["eagle3"], "fc_norm": True, "norm_output": True})}
"""Recipe switches of a method whose drafter runs another path (EAGLE-3.1's normed features and fed-back state)."""
PROMPT = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(3)).tolist()


def tiny_hf(kind: str):
    """A tiny random model of `kind` (llama, llama_tied, qwen2 with random biases, llama3_rope), eval mode; an
    untied LM head scaled 20x (a peaked target, few near ties)."""
    torch.manual_seed(0)
    if kind == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # random biases, so that a dropped bias shows
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(std=0.5)
    else:
        from transformers import LlamaForCausalLM

        config = tiny_llama_config(layers=3)
        config.tie_word_embeddings = kind == "llama_tied"
        if kind == "llama3_rope":
            config.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0) if not config.tie_word_embeddings else None
    return model.eval()


def hf_greedy(model, prompt, n):
    """Hugging Face greedy decoding of exactly n tokens after prompt (no EOS stops it)."""
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def target_info(model):
    """The TargetInfo of a tiny Hugging Face model."""
    return TargetInfo.from_hf_config(model.config, "tiny")


def memorise(spec, cfg, draft, model, sequence, steps=20):
    """Optimizer steps on one sequence the target will produce, so that drafts there get accepted."""
    ids, ones = sequence[None], torch.ones_like(sequence[None])
    feats = capture_features(model, ids, ones, spec.feature_layers(cfg, target_info(model)))
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    with torch.enable_grad():
        for _ in range(steps):
            loss = spec.loss(draft, DraftBatch(ids, ones, ones, feats), cfg).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


@functools.lru_cache(maxsize=None)
def trained_case(method):
    """A tiny random target and the method's draft, trained on the target's own continuation of PROMPT."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # a peaked, repetitive target
    method, settings = VARIANTS.get(method, (method, CASES.get(method)))
    info, spec = target_info(model), METHODS[method]
    cfg = spec.config(**settings)
    sequence = torch.tensor(PROMPT + hf_greedy(model, PROMPT, 40))
    counts = torch.randint(0, 50, (info.vocab_size,)) + 1000 * torch.bincount(sequence, minlength=info.vocab_size)
    draft = spec.build(cfg, DraftContext(info, counts))
    if spec.bind_target is not None:
        spec.bind_target(draft, model)
    memorise(spec, cfg, draft, model, sequence)
    return model, spec, cfg, draft.eval()


def trained_engine(method, shape):
    """trained_case(method) and a runtime engine over its target and draft -> (model, spec, draft, engine)."""
    model, spec, cfg, draft = trained_case(method)
    target = from_hf(model, target_info(model))
    engine = SpecEngine(target, spec.runtime(draft, cfg, target), shape, 256, hf_rope_tables(model, 256))
    return model, spec, draft, engine


def training_side_chain(model, spec, draft, confirmed, k):
    """The method's training-side chain drafter's k tokens after the confirmed ones (what the runtime must draft)."""
    tokens = torch.tensor([confirmed])
    out = model(tokens[:, :-1], output_hidden_states=True)
    features = TargetFeatures(hidden_states={i: h for i, h in enumerate(out.hidden_states)})
    state = ChainState(tokens=tokens, features=features, embed=model.get_input_embeddings(),
                       lm_head=model.get_output_embeddings().weight)
    return chain_of(spec.name)(draft, state, k).tolist()
