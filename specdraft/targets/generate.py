"""Batched generation with the frozen Hugging Face target: left-padded prompts in, each row's new tokens out.
`distill-data` regenerates answers with it; a method that needs the target's own continuations of many
prefixes (mined labels) generates them with it too."""
from __future__ import annotations

from typing import List, Sequence

import torch

GREEDY = {"do_sample": False, "num_beams": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 50,
          "repetition_penalty": 1.0}
"""model.generate arguments for greedy decoding, none left to the model's own generation_config."""


def left_pad(prompts: List[List[int]], pad_id: int, device) -> tuple:
    """-> input_ids [B, T], attention_mask [B, T], prompts right-aligned (left padding)."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids.to(device), attention_mask.to(device)


def cut_at_eos(ids: List[int], eos_ids: Sequence[int]) -> List[int]:
    """Generated ids up to (not including) the first EOS."""
    return ids[:next((i for i, token in enumerate(ids) if token in eos_ids), len(ids))]


@torch.no_grad()
def greedy_continuations(model, prompts: List[List[int]], max_new_tokens: int, eos_ids: Sequence[int],
                         pad_id: int) -> List[List[int]]:
    """The target's greedy continuation of each prompt (one batch), up to `max_new_tokens`, cut before EOS."""
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, pad_id, device)  # [B, T]
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                            eos_token_id=list(eos_ids), pad_token_id=pad_id, **GREEDY)
    return [cut_at_eos(row, eos_ids) for row in output[:, input_ids.shape[1]:].tolist()]
