"""Tree attention, the spec: the confirmed prefix is visible to every query, the N tree nodes by a tree mask."""
import torch
import torch.nn.functional as F


def visible_slots(prefix_len: torch.Tensor, tree_mask: torch.Tensor, num_slots: int) -> torch.Tensor:
    """prefix_len [1]; tree_mask [N, N] -> [N, S] bool: slot s visible to node i."""
    n = tree_mask.shape[0]
    slot = torch.arange(num_slots, device=tree_mask.device)  # [S]
    relative = slot - prefix_len  # [S]
    in_tree = (relative >= 0) & (relative < n)
    tree_part = tree_mask[:, relative.clamp(0, n - 1)] & in_tree  # [N, S]
    return tree_part | (relative < 0)


def tree_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             prefix_len: torch.Tensor, tree_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, N, D]; k/v_cache [Hkv, S, D]; prefix_len [1]; tree_mask [N, N] -> [Hq, N, D]."""
    mask = visible_slots(prefix_len, tree_mask, k_cache.shape[1])  # [N, S]
    groups = q.shape[0] // k_cache.shape[0]
    keys = k_cache.repeat_interleave(groups, dim=0).float()  # [Hq, S, D]
    values = v_cache.repeat_interleave(groups, dim=0).float()
    out = F.scaled_dot_product_attention(q.float(), keys, values, attn_mask=mask, scale=scale)
    return out.to(q.dtype)
