"""The spec of a draft tree's selection (runtime/tree.py, after the expansion): the root and the `budget - 1`
candidates of highest joint score (ties: the lower candidate index first), in candidate order, with each node's
parent among them, its depth, its tree-attention row, and whether it is a real node: its path reaches the root and
it scores above -inf. Padding (a candidate whose ancestor fell out on a tie, or one a tree scorer dropped, scored
-inf, taken when fewer candidates than the budget were kept) hangs under no node (parent -1, as the root: no
verify matches it), sits at depth 1, sees itself alone, scores -inf. A NaN score (a broken draft or scorer) ranks
as -inf and makes padding: whatever the scores, node 0 is the root."""
from typing import NamedTuple

import torch


class TreeSelection(NamedTuple):
    tokens: torch.Tensor  # [N] int64 target ids; node 0 is the root
    parents: torch.Tensor  # [N] int64 parent node, -1 for the root and for padding
    depths: torch.Tensor  # [N] int64, 0 for the root, 1 for padding
    valid: torch.Tensor  # [N] bool: False for padding (a real node's ancestors are real: a child scores <= its parent)
    tree_mask: torch.Tensor  # [N, N] bool: node i sees node j (j is i or an ancestor)
    joint_logprobs: torch.Tensor  # [N] float32: the path's draft log-probability (0 for the root, -inf: padding)
    chosen: torch.Tensor  # [N] int64 ascending: each node's candidate index


def ancestry(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """parents [N] (-1: none) -> reach [N, N] bool: node j is node i or one of its ancestors up to
    2 ** ceil(log2(max_depth)) steps up (a node under a missing parent reaches neither it nor the root), by
    repeated squaring of the one-step relation."""
    index = torch.arange(parents.shape[0], device=parents.device)
    reach = ((parents[:, None] == index[None, :]) | (index[:, None] == index[None, :])).float()  # [N, N]
    hops = 1
    while hops < max_depth:  # reach covers paths of up to `hops` steps
        reach = (reach @ reach).clamp(max=1.0)
        hops *= 2
    return reach > 0


def select_tree_reference(cand_tokens: torch.Tensor, cand_parents: torch.Tensor, cand_scores: torch.Tensor,
                          budget: int, max_depth: int) -> TreeSelection:
    """cand_tokens [C] int64, cand_parents [C] int64 (a candidate index, -1 for the root, candidate 0),
    cand_scores [C] float32 joint log-probabilities; budget N <= C; max_depth: the deepest candidate's depth ->
    TreeSelection."""
    count, device = cand_scores.shape[0], cand_scores.device
    index = torch.arange(count, device=device)
    ordered = torch.where(cand_scores == cand_scores, cand_scores, float("-inf"))  # a NaN ranks last: never the root's
    scores = torch.where(index == 0, float("inf"), ordered)  # the root is always kept
    chosen = torch.sort(torch.sort(scores, descending=True, stable=True).indices[:budget]).values  # [N]
    node_of = torch.full((count,), -1, dtype=torch.long, device=device)
    node_of[chosen] = torch.arange(budget, device=device)
    is_root = torch.arange(budget, device=device) == 0
    parents = torch.where(is_root, -1, node_of[cand_parents[chosen].clamp(min=0)])  # [N], -1: parent not kept
    reach = ancestry(parents, max_depth)  # [N, N]
    valid = reach[:, 0] & (cand_scores[chosen] > float("-inf"))  # the path reaches the root; not dropped
    tree_mask = reach & valid[:, None] | torch.eye(budget, dtype=torch.bool, device=device)  # [N, N]
    return TreeSelection(tokens=cand_tokens[chosen], parents=torch.where(valid, parents, -1),
                         depths=torch.where(valid, reach.sum(1) - 1, 1), valid=valid, tree_mask=tree_mask,
                         joint_logprobs=torch.where(valid, cand_scores[chosen], float("-inf")), chosen=chosen)
