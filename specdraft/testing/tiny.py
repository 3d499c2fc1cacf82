"""Tiny random targets built in place: a byte-level tokenizer with a ChatML template, small Llama and Qwen2 configs,
and a small random target saved as a Hugging Face directory."""
from __future__ import annotations

from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<pad>"]


def byte_tokenizer(chat_template: str | None = CHATML):
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS[:2], "pad_token": "<pad>",
                                  "eos_token": "<|im_end|>"})
    tokenizer.chat_template = chat_template
    return tokenizer


def tiny_llama_config(vocab_size: int = 320, hidden: int = 64, layers: int = 4, heads: int = 4, kv_heads: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       eos_token_id=257, bos_token_id=None, pad_token_id=258)


def tiny_qwen2_config(vocab_size: int = 320, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2):
    """Qwen2's differences from Llama: biases on q, k and v, a tied LM head."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       eos_token_id=257, pad_token_id=258)


def save_tiny_target(directory: Path, chat_template: str | None = CHATML, seed: int = 0, layers: int = 4,
                     family: str = "llama") -> Path:
    """A tiny random Llama (or Qwen2) target + tokenizer saved as an HF directory; returns the directory."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    tokenizer = byte_tokenizer(chat_template)
    config = tiny_llama_config(layers=layers) if family == "llama" else tiny_qwen2_config(layers=layers)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = (LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM)(config)
    with torch.no_grad():  # a peaked, repetitive distribution: easy for a draft to learn, like real text
        model.get_output_embeddings().weight.mul_(40.0)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
