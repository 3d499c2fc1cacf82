"""Greedy tree verification, the spec. Node i (not the root) matches when its token is the target's argmax at
its parent (argmax ties: lowest id). The accepted path is the root plus the deepest chain of matching nodes
from the root (among matching siblings, the lowest node index), at most `depth_limit` drafted nodes long."""
import torch


def verify_greedy_reference(target_logits: torch.Tensor, tree_tokens: torch.Tensor, parents: torch.Tensor,
                            depth_limit: int):
    """target_logits [N, V]; tree_tokens, parents [N] int64 (parents[0] = -1, parents[i] < i; -1 also
    marks a node no path reaches) -> (accepted_nodes [depth_limit + 1] int64 padded with -1, accept_length [1]
    int64, bonus_token [1] int64)."""
    num_nodes = tree_tokens.shape[0]
    node_ids = torch.arange(num_nodes, device=tree_tokens.device)  # [N]
    target_argmax = target_logits.argmax(dim=-1)  # [N], first maximal id
    matches = (tree_tokens == target_argmax[parents.clamp(min=0)]) & (parents >= 0)  # [N]
    current = torch.zeros(1, dtype=torch.int64, device=tree_tokens.device)  # [1]
    path = [current]
    for _ in range(depth_limit):  # once no child matches, `current` stays and every later step finds none
        children = matches & (parents == current)  # [N]
        found = children.any(dim=0, keepdim=True)  # [1]
        lowest_child = torch.where(children, node_ids, num_nodes).amin(dim=0, keepdim=True)  # [1]
        path.append(torch.where(found, lowest_child, -1))
        current = torch.where(found, lowest_child, current)
    accepted_nodes = torch.cat(path)  # [depth_limit + 1]
    accept_length = (accepted_nodes[1:] >= 0).sum(dim=0, keepdim=True)  # [1]
    return accepted_nodes, accept_length, target_argmax[current]
