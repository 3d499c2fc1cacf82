"""Tiny random models of every target family the verifier runs (decoding/verifier/families/), built from
transformers' own config classes: the configs mix what the families differ in (windows of 8 tokens, local and
global layers interleaved with Gemma 3's two rotary bases, head_dim != H / heads, q/k norms, 1 + w norms,
sandwich norms, GeGLU, scaled embeddings, query_pre_attn_scalar, a final-logit softcap, routed experts
renormalised or not, a shared expert, dense layers between MoE ones). tests/test_families_runtime.py and
tools/bench/families.py build their targets here."""
from __future__ import annotations

import torch

VOCAB, WINDOW = 320, 8
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None,
              pad_token_id=0, bos_token_id=None)
FAMILIES = ["llama", "qwen2", "mistral", "qwen3", "gemma3", "qwen3_moe", "qwen2_moe", "mixtral"]


def family_config(family: str, window: int = WINDOW, **overrides):
    """(model class, config) of a tiny `family` model; `overrides` replace COMMON's sizes (head_dim scales with
    hidden_size / num_attention_heads where a family sets its own)."""
    import transformers as hf

    common = {**COMMON, **overrides}
    base_head_dim = common["hidden_size"] // common["num_attention_heads"]
    if family == "llama":
        return hf.LlamaForCausalLM, hf.LlamaConfig(**common)
    if family == "qwen2":
        return hf.Qwen2ForCausalLM, hf.Qwen2Config(**common)
    if family == "mistral":
        return hf.MistralForCausalLM, hf.MistralConfig(**common, sliding_window=window)
    if family == "qwen3":  # layers 2.. slide (max_window_layers), head_dim twice H / heads
        return hf.Qwen3ForCausalLM, hf.Qwen3Config(**common, head_dim=2 * base_head_dim, use_sliding_window=True,
                                                   sliding_window=window, max_window_layers=2)
    if family == "gemma3":
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}
        kinds = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
        return hf.Gemma3ForCausalLM, hf.Gemma3TextConfig(
            **common, head_dim=2 * base_head_dim, sliding_window=window,
            query_pre_attn_scalar=int(1.5 * base_head_dim), final_logit_softcapping=30.0,
            layer_types=[kinds[i % len(kinds)] for i in range(common["num_hidden_layers"])], rope_parameters=rope)
    if family == "qwen3_moe":  # layer 1 dense (mlp_only_layers)
        return hf.Qwen3MoeForCausalLM, hf.Qwen3MoeConfig(
            **common, head_dim=base_head_dim, moe_intermediate_size=common["intermediate_size"] // 3,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1], use_sliding_window=True,
            sliding_window=window)
    if family == "qwen2_moe":  # every other layer MoE; a shared expert; the softmax's routing weights
        return hf.Qwen2MoeForCausalLM, hf.Qwen2MoeConfig(
            **common, moe_intermediate_size=common["intermediate_size"] // 3,
            shared_expert_intermediate_size=common["intermediate_size"] // 2, num_experts=8, num_experts_per_tok=3,
            norm_topk_prob=False, decoder_sparse_step=2, use_sliding_window=True, sliding_window=window,
            max_window_layers=common["num_hidden_layers"])
    if family == "mixtral":
        return hf.MixtralForCausalLM, hf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2,
                                                       sliding_window=window)
    raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")


def tiny_family(family: str, seed: int = 0, window: int = WINDOW, **overrides):
    """A tiny random `family` model, float32, eval: random norms (so a dropped 1 + w shows), biases, experts and
    routers, and a peaked next-token distribution (no near ties)."""
    model_class, config = family_config(family, window, **overrides)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 or "experts" in name or name.endswith("gate.weight"):
                param.normal_(0.0, 0.3 if param.dim() == 1 else 0.1)
        model.lm_head.weight.mul_(8.0)
    return model
