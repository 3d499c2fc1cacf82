"""Tree attention, the spec. Query i (a tree node) sees key slot s iff s < prefix_len (the confirmed context) or
s = prefix_len + j with tree_mask[i, j] (node j is i or one of its ancestors); slots from prefix_len + W on hold
stale data and are never seen. The mask is [N, W]: a verify's is square (its N nodes sit at the W = N slots after
the prefix); a drafting step's N frontier nodes see W scratch slots. Grouped-query: query head h reads kv head
h // (Hq / Hkv).

A sliding-window layer (`sliding_window` w, with the queries' `positions` [N]; a verify's square mask, W = N)
also hides every key more than w - 1 positions before the query's own: a key's position is its slot before
prefix_len (the confirmed tokens sit at slot = position) and its node's position in the tree (node j at slot
prefix_len + j is at positions[j]), and query i sees it iff key position > positions[i] - w (Hugging Face's
sliding-window mask: the w latest positions, the query's own included)."""
from typing import Optional

import torch
import torch.nn.functional as F


def visible_slots(prefix_len: torch.Tensor, tree_mask: torch.Tensor, seq_len: int,
                  first_column: int = 0) -> torch.Tensor:
    """prefix_len [1] int64; tree_mask [N, W] bool; window columns before first_column never seen -> [N, S] bool,
    which key slots each query sees."""
    window = tree_mask.shape[1]
    slots = torch.arange(seq_len, device=tree_mask.device)  # [S]
    tree_index = slots - prefix_len  # [S]
    in_tree = (tree_index >= first_column) & (tree_index < window)  # [S]
    sees_node = tree_mask[:, tree_index.clamp(0, window - 1)] & in_tree  # [N, S]
    return (slots < prefix_len) | sees_node


def in_sliding_window(prefix_len: torch.Tensor, positions: torch.Tensor, sliding_window: int,
                      seq_len: int) -> torch.Tensor:
    """prefix_len [1] int64; positions [N] int64 of the queries, node j's at slot prefix_len + j -> [N, S] bool:
    whether slot s's key lies within the query's sliding window (its position > the query's - sliding_window)."""
    slots = torch.arange(seq_len, device=positions.device)  # [S]
    tree_index = (slots - prefix_len).clamp(0, positions.shape[0] - 1)  # [S]
    key_positions = torch.where(slots < prefix_len, slots, positions[tree_index])  # [S]
    return key_positions[None, :] > (positions - sliding_window)[:, None]


def tree_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             prefix_len: torch.Tensor, tree_mask: torch.Tensor, scale: float,
                             first_column: int = 0, sliding_window: Optional[int] = None,
                             positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [Hq, N, D]; k_cache, v_cache [Hkv, S, D]; prefix_len [1] int64; tree_mask [N, W] bool; first_column:
    window columns before it are never seen; sliding_window (with positions [N], W = N) or None -> [Hq, N, D]."""
    group = q.shape[0] // k_cache.shape[0]
    mask = visible_slots(prefix_len, tree_mask, k_cache.shape[1], first_column)  # [N, S]
    if sliding_window is not None:
        mask = mask & in_sliding_window(prefix_len, positions, sliding_window, k_cache.shape[1])
    keys = k_cache.repeat_interleave(group, dim=0)  # [Hq, S, D]
    values = v_cache.repeat_interleave(group, dim=0)  # [Hq, S, D]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
