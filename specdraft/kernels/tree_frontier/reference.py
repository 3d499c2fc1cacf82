"""The spec of one EAGLE-2 tree expansion step's bookkeeping (runtime/tree.py): the children's joint scores and
parents, the k best children by joint score (ties: the lower child index first) as the next frontier, and the
rows of the frontier's draft outputs and masks that those children continue from."""
from typing import NamedTuple, Optional

import torch


class Frontier(NamedTuple):
    joint: torch.Tensor  # [k * K] float32: each child's joint log-probability (its parent's + its own)
    parents: torch.Tensor  # [k * K] int64: each child's parent, as a candidate index
    scores: torch.Tensor  # [k] float32: the next frontier's joint log-probabilities, descending
    tokens: torch.Tensor  # [k] int64: its target ids
    ids: torch.Tensor  # [k] int64: its candidate indices (base + child index)
    best: torch.Tensor  # [k] int64: its child indices in 0..k*K-1
    hidden: torch.Tensor  # [k, H]: the draft output row of each one's parent
    visible: torch.Tensor  # [k, W] bool: the scratch mask row of each one's parent (+ its own slot, if given)


def advance_frontier_reference(child_logprobs: torch.Tensor, child_tokens: torch.Tensor, frontier_scores: torch.Tensor,
                               frontier_ids: torch.Tensor, base: int, hidden: torch.Tensor,
                               visible: torch.Tensor, own_slot_base: Optional[int] = None) -> Frontier:
    """child_logprobs [k, K] float32 and child_tokens [k, K] int64 (each frontier node's top K children);
    frontier_scores [k] float32, frontier_ids [k] int64; base: the candidate index of child 0; hidden [k, H];
    visible [k, W] bool; own_slot_base: when given, the next frontier's node j also sees its own scratch slot
    own_slot_base + j (where the next step writes it) -> Frontier."""
    k, children = child_logprobs.shape
    joint = (frontier_scores[:, None] + child_logprobs).flatten()  # [k * K]
    parents = frontier_ids[:, None].expand(k, children).reshape(-1)  # [k * K]
    best = torch.sort(joint, descending=True, stable=True).indices[:k]  # [k]
    lane = best // children  # [k] the parent's row
    next_visible = visible[lane]  # [k, W]
    if own_slot_base is not None:
        own = own_slot_base + torch.arange(k, device=visible.device)  # [k]
        next_visible = next_visible | (torch.arange(visible.shape[1], device=visible.device) == own[:, None])
    return Frontier(joint, parents, joint[best], child_tokens.flatten()[best], base + best, best, hidden[lane],
                    next_visible)
