"""Ragged attention, the spec. Many sequences share one cache, each in its own range of slots: query i sees the
slots starts[i] .. starts[i] + lengths[i] - 1 and nothing else (its sequence's keys up to its own position, its
own key included, written before the attention). Grouped-query: query head h reads kv head h // (Hq / Hkv).

A batch of decode steps (one query per sequence) and a packed prefill (every prompt token of several prompts,
each query seeing its prompt's slots up to itself: causal within the prompt) are both this one function. A
sliding-window layer's query sees the last w slots of its range alone (`window_range`)."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F


def visible_range(starts: torch.Tensor, lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """starts, lengths [N] int64 -> [N, S] bool: which of the cache's S slots each query sees."""
    slots = torch.arange(seq_len, device=starts.device)  # [S]
    return (slots >= starts[:, None]) & (slots < (starts + lengths)[:, None])


def window_range(starts: torch.Tensor, lengths: torch.Tensor, sliding_window: int,
                 max_length: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """A sliding-window layer's ranges: query i sees the last min(lengths[i], sliding_window) slots of its range
    (Hugging Face's sliding-window mask: the w latest positions, its own included) -> (starts, lengths [N],
    the longest range)."""
    dropped = (lengths - sliding_window).clamp(min=0)  # [N] slots before the window
    return starts + dropped, lengths - dropped, min(max_length, sliding_window)


def ragged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, starts: torch.Tensor,
                               lengths: torch.Tensor, scale: float, max_length: Optional[int] = None) -> torch.Tensor:
    """q [Hq, N, D]; k_cache, v_cache [Hkv, S, D]; starts, lengths [N] int64, 1 <= lengths <= max_length (None:
    read from lengths, a host sync) -> [Hq, N, D]. Each query's window of max_length slots from its start is
    gathered, the slots past its length masked."""
    width = int(lengths.max()) if max_length is None else max_length
    offsets = torch.arange(width, device=q.device)  # [W]
    slots = (starts[:, None] + offsets).clamp(max=k_cache.shape[1] - 1)  # [N, W]
    keys, values = k_cache[:, slots].transpose(0, 1), v_cache[:, slots].transpose(0, 1)  # [N, Hkv, W, D]
    mask = (offsets < lengths[:, None])[:, None, None, :]  # [N, 1, 1, W]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[:, :, None], keys, values, attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[0] != k_cache.shape[0])  # [N, Hq, 1, D]
    return out[:, :, 0].transpose(0, 1)
