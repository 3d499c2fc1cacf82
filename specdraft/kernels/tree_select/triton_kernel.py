"""A draft tree's selection in one launch (one program): the budget best candidates by packed (score, lower
index first) keys, their node numbers by a prefix sum, and each node's ancestors by walking its parents, which
the program writes out and reads back behind a barrier. Replaces about 45 launches a cycle (top-k, sort, the
node map, the parent gathers, the ancestry's matmuls and the masks)."""
import math

import torch
import triton
import triton.language as tl

from specdraft.kernels.draft_topk.triton_kernel import EMPTY_KEY, pack_keys
from specdraft.kernels.launch import next_power_of_2
from specdraft.kernels.tree_select.reference import TreeSelection


@triton.jit
def _select_kernel(cand_tokens_ptr, cand_parents_ptr, cand_scores_ptr, count, node_of_ptr, chosen_ptr,
                   parent_node_ptr, tokens_ptr, parents_ptr, depths_ptr, valid_ptr, mask_ptr, joint_ptr,
                   BUDGET: tl.constexpr, HOPS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr):
    cand = tl.arange(0, BLOCK_C)  # [BLOCK_C] candidate index
    in_range = cand < count
    scores = tl.load(cand_scores_ptr + cand, mask=in_range, other=0.0)
    scores = tl.where(scores == scores, scores, -float("inf"))  # a NaN ranks last: never the root's place
    keys = tl.where(in_range, pack_keys(tl.where(cand == 0, float("inf"), scores), cand), EMPTY_KEY)
    remaining = keys
    for _ in range(BUDGET - 1):  # drop the BUDGET - 1 largest: the largest left is the threshold
        remaining = tl.where(remaining == tl.max(remaining, 0), EMPTY_KEY, remaining)
    selected = in_range & (keys >= tl.max(remaining, 0))
    picked = selected.to(tl.int32)
    node_of = tl.cumsum(picked, 0) - picked  # [BLOCK_C] each selected candidate's node, in candidate order
    tl.store(node_of_ptr + cand, tl.where(selected, node_of, -1).to(tl.int64), mask=in_range)
    tl.store(chosen_ptr + node_of, cand.to(tl.int64), mask=selected)
    tl.debug_barrier()
    node = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    is_node = node < BUDGET
    chosen = tl.load(chosen_ptr + node, mask=is_node, other=0)
    cand_parent = tl.load(cand_parents_ptr + chosen, mask=is_node, other=-1)
    parent = tl.load(node_of_ptr + tl.maximum(cand_parent, 0), mask=is_node & (cand_parent >= 0), other=-1)
    parent = tl.where(node == 0, -1, parent)
    tl.store(parent_node_ptr + node, parent, mask=is_node)
    tl.debug_barrier()
    columns = tl.arange(0, BLOCK_N)
    reach = node[:, None] == columns[None, :]  # [BLOCK_N, BLOCK_N]
    ancestor = parent
    for _ in range(HOPS):  # one step up the parents each (-1 matches no column)
        reach = reach | (ancestor[:, None] == columns[None, :])
        ancestor = tl.load(parent_node_ptr + tl.maximum(ancestor, 0), mask=is_node & (ancestor >= 0), other=-1)
    joint = tl.load(cand_scores_ptr + chosen, mask=is_node, other=0.0)
    reaches = tl.sum(tl.where(reach & (columns[None, :] == 0), 1, 0), 1) > 0  # [BLOCK_N] reaches the root
    valid = reaches & (joint > -float("inf"))  # and no scorer dropped it
    depth = tl.sum(reach.to(tl.int64), 1) - 1
    rows = (reach & valid[:, None]) | (node[:, None] == columns[None, :])
    in_mask = is_node[:, None] & (columns[None, :] < BUDGET)
    tl.store(mask_ptr + node[:, None] * BUDGET + columns[None, :], rows.to(tl.uint8), mask=in_mask)
    tl.store(tokens_ptr + node, tl.load(cand_tokens_ptr + chosen, mask=is_node, other=0), mask=is_node)
    tl.store(parents_ptr + node, tl.where(valid & (node != 0), parent, -1), mask=is_node)
    tl.store(depths_ptr + node, tl.where(valid, depth, 1), mask=is_node)
    tl.store(valid_ptr + node, valid.to(tl.uint8), mask=is_node)
    tl.store(joint_ptr + node, tl.where(valid, joint, float("-inf")), mask=is_node)


def select_tree_triton(cand_tokens: torch.Tensor, cand_parents: torch.Tensor, cand_scores: torch.Tensor,
                       budget: int, max_depth: int) -> TreeSelection:
    """The reference's contract (reference.py), in one launch."""
    count, device = cand_scores.shape[0], cand_scores.device
    long = dict(dtype=torch.int64, device=device)
    node_of, chosen, parent_node = torch.empty(count, **long), torch.empty(budget, **long), torch.empty(budget, **long)
    tokens, parents, depths = (torch.empty(budget, **long) for _ in range(3))
    valid = torch.empty(budget, dtype=torch.bool, device=device)
    tree_mask = torch.empty(budget, budget, dtype=torch.bool, device=device)
    joint = torch.empty(budget, dtype=torch.float32, device=device)
    hops = 1 << math.ceil(math.log2(max(max_depth, 1)))  # the reference's repeated squaring reaches as far
    _select_kernel[(1,)](cand_tokens.contiguous(), cand_parents.contiguous(), cand_scores.float().contiguous(), count,
                         node_of, chosen, parent_node, tokens, parents, depths, valid.view(torch.uint8),
                         tree_mask.view(torch.uint8), joint, BUDGET=budget, HOPS=hops,
                         BLOCK_C=next_power_of_2(count), BLOCK_N=max(16, next_power_of_2(budget)), num_warps=4)
    return TreeSelection(tokens, parents, depths, valid, tree_mask, joint, chosen)
