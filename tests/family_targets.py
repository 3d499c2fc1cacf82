"""Tiny random targets of every family specdraft trains drafts for, saved by transformers' own classes with the byte
tokenizer of specdraft.testing.tiny: hidden 64, 2 layers unless asked (MoE: 4 experts, top 2), windows short
enough (16) that a row of distilled tokens runs past them."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict

import torch

from specdraft.testing.tiny import CHATML, byte_tokenizer

WINDOW = 16
"""Sliding window of the families that have one (Mistral, Gemma 3's local layers): shorter than the test rows."""

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=1024)


def _llama(layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(**COMMON, num_hidden_layers=layers, rms_norm_eps=1e-5, tie_word_embeddings=False)


def _qwen2(layers: int):
    from transformers import Qwen2Config

    return Qwen2Config(**COMMON, num_hidden_layers=layers, rms_norm_eps=1e-6, tie_word_embeddings=True)


def _mistral(layers: int):
    """Mistral's difference: every layer attends within `sliding_window` (no layer_types)."""
    from transformers import MistralConfig

    return MistralConfig(**COMMON, num_hidden_layers=layers, head_dim=16, sliding_window=WINDOW,
                         tie_word_embeddings=False)


def _qwen3(layers: int):
    """Qwen3's difference: RMS norms on the queries and keys of each head."""
    from transformers import Qwen3Config

    return Qwen3Config(**COMMON, num_hidden_layers=layers, head_dim=16, tie_word_embeddings=True)


def _gemma3(layers: int):
    """Gemma 3's differences: embeddings scaled by sqrt(H), norms with a +1 offset, local (windowed) and global
    layers, a tied head; the logit softcap of Gemma 2 is set here (Gemma 3's checkpoints leave it null) to exercise
    it."""
    from transformers import Gemma3TextConfig

    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return Gemma3TextConfig(**COMMON, num_hidden_layers=layers, head_dim=16, query_pre_attn_scalar=16,
                            sliding_window=WINDOW, layer_types=layer_types, final_logit_softcapping=30.0,
                            tie_word_embeddings=True)


def _qwen3_moe(layers: int):
    """Qwen3-MoE's difference: a routed mixture of experts in place of every layer's MLP."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**COMMON, num_hidden_layers=layers, head_dim=16, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=64, decoder_sparse_step=1, tie_word_embeddings=False)


def _mixtral(layers: int):
    from transformers import MixtralConfig

    return MixtralConfig(**COMMON, num_hidden_layers=layers, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                         tie_word_embeddings=False)


FAMILY_CONFIGS: Dict[str, Callable] = {"llama": _llama, "qwen2": _qwen2, "mistral": _mistral, "qwen3": _qwen3,
                                       "gemma3": _gemma3, "qwen3_moe": _qwen3_moe, "mixtral": _mixtral}
"""Family -> its tiny config."""

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "mixtral": "MixtralForCausalLM"}
"""Family -> the Hugging Face class its checkpoint names (config.json's architectures)."""


def family_config(family: str, layers: int = 2):
    return FAMILY_CONFIGS[family](layers)


def save_family_target(directory: Path, family: str, layers: int = 2, seed: int = 0,
                       chat_template: str | None = CHATML) -> Path:
    """A tiny random target of `family` + the byte tokenizer, saved as an HF directory; returns the directory."""
    from transformers import AutoModelForCausalLM

    tokenizer = byte_tokenizer(chat_template)
    config = family_config(family, layers)
    config.eos_token_id, config.pad_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == ARCHITECTURES[family], type(model).__name__
    with torch.no_grad():  # a peaked, repetitive distribution, as specdraft.testing.tiny's: easy for a draft to learn
        model.get_output_embeddings().weight.mul_(40.0)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
