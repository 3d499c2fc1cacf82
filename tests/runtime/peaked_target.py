"""A tiny random Llama (2 layers) whose next-token distribution is peaked and repetitive, and its greedy continuation
by Hugging Face `generate`: the target and the expected tokens of the runtime tests whose drafters know the answer
(the block cycle's, the hostile drafts')."""
from __future__ import annotations

from typing import List

import torch

from specdraft.testing.tiny import tiny_llama_config


def peaked_llama():
    """The target, seed 0, eval: its LM head scaled up so that drafts which know the answer land where they are
    right."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=2)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


def greedy_tokens(model, prompt: List[int], n: int) -> List[int]:
    """The model's `n` greedy tokens after `prompt`, no EOS."""
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()
