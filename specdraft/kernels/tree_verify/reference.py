"""Greedy tree verification, the spec: the deepest chain of nodes whose tokens are the target's argmax."""
import torch


def verify_greedy_reference(target_logits: torch.Tensor, tree_tokens: torch.Tensor, parents: torch.Tensor,
                            depth_limit: int):
    """target_logits [N, V]; tree_tokens [N]; parents [N] (parents[0] = -1, parents[i] < i)
    -> (accepted_nodes [depth_limit + 1] padded with -1, accept_length [1], bonus_token [1])."""
    n = tree_tokens.shape[0]
    target_next = target_logits.argmax(-1)  # [N]
    parent = parents.clamp(min=0)
    index = torch.arange(n, device=tree_tokens.device)
    is_root = index == 0
    matches = ((tree_tokens == target_next[parent]) & (parents >= 0)) | is_root  # [N]
    depth = torch.zeros_like(tree_tokens)
    on_path = matches
    for _ in range(depth_limit):  # a node is on an accepted path if all its ancestors match
        on_path = (matches & on_path[parent]) | is_root
        depth = torch.where(parents >= 0, depth[parent] + 1, 0)
    score = torch.where(on_path, depth * n + (n - 1 - index), -1)  # deepest, then lowest index
    last = score.argmax()
    accept_length = depth[last].view(1)
    accepted = torch.full((depth_limit + 1,), -1, dtype=torch.long, device=tree_tokens.device)
    node = last
    for step in range(depth_limit, -1, -1):  # walk up from the last accepted node
        slot_ok = step <= accept_length[0]
        accepted[step] = torch.where(slot_ok, node, accepted[step])
        node = torch.where(slot_ok & (step > 0), parent[node], node)
    return accepted, accept_length, target_next[last].view(1)
