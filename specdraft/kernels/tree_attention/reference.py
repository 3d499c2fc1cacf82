"""Tree attention, the spec. Query i (a tree node) sees key slot s iff s < prefix_len (the confirmed context) or
s = prefix_len + j with tree_mask[i, j] (node j is i or one of its ancestors); slots from prefix_len + W on hold
stale data and are never seen. The mask is [N, W]: a verify's is square (its N nodes sit at the W = N slots after
the prefix); a drafting step's N frontier nodes see W scratch slots. Grouped-query: query head h reads kv head
h // (Hq / Hkv)."""
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


def tree_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             prefix_len: torch.Tensor, tree_mask: torch.Tensor, scale: float,
                             first_column: int = 0) -> torch.Tensor:
    """q [Hq, N, D]; k_cache, v_cache [Hkv, S, D]; prefix_len [1] int64; tree_mask [N, W] bool; first_column:
    window columns before it are never seen -> [Hq, N, D]."""
    group = q.shape[0] // k_cache.shape[0]
    mask = visible_slots(prefix_len, tree_mask, k_cache.shape[1], first_column)  # [N, S]
    keys = k_cache.repeat_interleave(group, dim=0)  # [Hq, S, D]
    values = v_cache.repeat_interleave(group, dim=0)  # [Hq, S, D]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
