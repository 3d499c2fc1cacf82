"""`tree_attention`: attention of N tree nodes over a static KV cache (prefix fully visible, nodes by mask)."""
import torch

from specdraft.kernels.tree_attention.reference import tree_attention_reference, visible_slots


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_len: torch.Tensor,
                   tree_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, N, D]; k/v_cache [Hkv, S, D]; prefix_len [1] int64; tree_mask [N, N] bool -> [Hq, N, D]."""
    return tree_attention_reference(q, k_cache, v_cache, prefix_len, tree_mask, scale)


__all__ = ["tree_attention", "tree_attention_reference", "visible_slots"]
