"""One tree expansion step's bookkeeping in one launch (one program): joint scores and parents of the k * K
children, their top k by repeated max over packed (score, lower index first) keys, and the gathered rows of the
parents' draft outputs and masks (each mask row with its node's own next scratch slot set, when asked). Replaces
nine launches a depth (add, reshape copy, topk, floor divide, three gathers, add, the own slot's or)."""
import torch
import triton
import triton.language as tl

from specdraft.kernels.draft_topk.triton_kernel import EMPTY_KEY, pack_keys, unpack_key
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.tree_frontier.reference import Frontier


@triton.jit
def _frontier_kernel(child_logprobs_ptr, child_tokens_ptr, frontier_scores_ptr, frontier_ids_ptr, base,
                     hidden_ptr, hidden_stride, visible_ptr, joint_ptr, parents_ptr, scores_ptr, tokens_ptr, ids_ptr,
                     best_ptr, hidden_out_ptr, visible_out_ptr, width, mask_width, own_slot_base,
                     OWN_SLOT: tl.constexpr, K: tl.constexpr, CHILDREN: tl.constexpr, BLOCK_KK: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    flat = tl.arange(0, BLOCK_KK)  # [BLOCK_KK] child index
    in_range = flat < K * CHILDREN
    lane = flat // CHILDREN
    joint = tl.load(frontier_scores_ptr + lane, mask=in_range, other=0.0) + tl.load(child_logprobs_ptr + flat,
                                                                                    mask=in_range, other=0.0)
    tl.store(joint_ptr + flat, joint, mask=in_range)
    tl.store(parents_ptr + flat, tl.load(frontier_ids_ptr + lane, mask=in_range, other=0), mask=in_range)
    keys = tl.where(in_range, pack_keys(joint, flat), EMPTY_KEY)
    columns, slots = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_W)
    for rank in tl.static_range(K):
        top = tl.max(keys, 0)
        keys = tl.where(keys == top, EMPTY_KEY, keys)
        score, child = unpack_key(top)
        parent_lane = child // CHILDREN
        tl.store(scores_ptr + rank, score)
        tl.store(tokens_ptr + rank, tl.load(child_tokens_ptr + child))
        tl.store(ids_ptr + rank, base + child)
        tl.store(best_ptr + rank, child)
        row = tl.load(hidden_ptr + parent_lane * hidden_stride + columns, mask=columns < width)
        tl.store(hidden_out_ptr + rank * width + columns, row, mask=columns < width)
        mask_row = tl.load(visible_ptr + parent_lane * mask_width + slots, mask=slots < mask_width)
        if OWN_SLOT:  # the next step's node `rank` also sees its own scratch slot
            mask_row = tl.where(slots == own_slot_base + rank, 1, mask_row).to(mask_row.dtype)
        tl.store(visible_out_ptr + rank * mask_width + slots, mask_row, mask=slots < mask_width)


def advance_frontier_triton(child_logprobs: torch.Tensor, child_tokens: torch.Tensor,
                            frontier_scores: torch.Tensor, frontier_ids: torch.Tensor, base: int,
                            hidden: torch.Tensor, visible: torch.Tensor,
                            own_slot_base: int | None = None) -> Frontier:
    """The reference's contract (reference.py), in one launch."""
    k, children = child_logprobs.shape
    device = child_logprobs.device
    child_logprobs, child_tokens = child_logprobs.contiguous(), child_tokens.contiguous()
    visible = visible.contiguous()
    if hidden.stride(-1) != 1:
        hidden = hidden.contiguous()
    joint = torch.empty(k * children, dtype=torch.float32, device=device)
    parents = torch.empty(k * children, dtype=torch.int64, device=device)
    scores = torch.empty(k, dtype=torch.float32, device=device)
    tokens, ids, best = (torch.empty(k, dtype=torch.int64, device=device) for _ in range(3))
    hidden_out = torch.empty(k, hidden.shape[1], dtype=hidden.dtype, device=device)
    visible_out = torch.empty_like(visible)
    _frontier_kernel[(1,)](child_logprobs.float(), child_tokens, frontier_scores.float(), frontier_ids, base, hidden,
                           hidden.stride(0), visible.view(torch.uint8), joint, parents, scores, tokens, ids, best,
                           hidden_out, visible_out.view(torch.uint8), hidden.shape[1], visible.shape[1],
                           own_slot_base if own_slot_base is not None else 0, OWN_SLOT=own_slot_base is not None, K=k,
                           CHILDREN=children,
                           BLOCK_KK=next_power_of_2(k * children), BLOCK_H=next_power_of_2(hidden.shape[1]),
                           BLOCK_W=next_power_of_2(visible.shape[1]), num_warps=4)
    return Frontier(joint, parents, scores, tokens, ids, best, hidden_out, visible_out)
