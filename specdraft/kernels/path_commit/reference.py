"""The spec of a cycle's commit bookkeeping (decoding/cycles/context.py, after the verify): from the accepted path
through the tree, the cache slots the KV compaction reads, the token after each path node (what the drafter
ingests), what the host reads (the count, then the emitted tokens), the captured target features of the path's
nodes, and the new root (the bonus token)."""
from typing import NamedTuple, Sequence, Tuple

import torch


class CommittedPath(NamedTuple):
    src_slots: torch.Tensor  # [D + 1] int64: the cache slot of each path node (past the count: prefix_len + row)
    next_tokens: torch.Tensor  # [D + 1] int64: the token after each path node (the bonus after the last accepted)
    for_host: torch.Tensor  # [D + 2] int64: the count (root + accepted), then the emitted tokens (-1 past it)
    features: Tuple[torch.Tensor, ...]  # each [D + 1, H]: a captured layer's rows of the path's nodes

    @property
    def count(self) -> torch.Tensor:  # [1]
        return self.for_host[:1]

    @property
    def emitted(self) -> torch.Tensor:  # [D + 1]
        return self.for_host[1:]


def commit_path_reference(accepted_nodes: torch.Tensor, accept_length: torch.Tensor, bonus: torch.Tensor,
                          tree_tokens: torch.Tensor, prefix_len: torch.Tensor, captured: Sequence[torch.Tensor],
                          root: torch.Tensor) -> CommittedPath:
    """accepted_nodes [D + 1] int64 (node 0 the root, then the accepted nodes, -1 past them); accept_length,
    bonus, prefix_len [1] int64; tree_tokens [N] int64 (the tree's tokens, node 0 the root); captured: [N, H]
    tensors (a target layer's features of every tree node); root [1] int64, set to the bonus token in place."""
    rows = torch.arange(accepted_nodes.shape[0], device=accepted_nodes.device)  # [D + 1]
    count = accept_length + 1  # [1]
    path = accepted_nodes.clamp(min=0)  # [D + 1]
    valid = rows < count
    src_slots = prefix_len + torch.where(valid, path, rows)
    after = torch.cat([tree_tokens[path[1:]], bonus])  # [D + 1] the token after each path node
    next_tokens = torch.where(rows == accept_length, bonus, after)
    root.copy_(bonus)
    for_host = torch.cat([count, torch.where(valid, next_tokens, -1)])  # [D + 2]
    return CommittedPath(src_slots, next_tokens, for_host, tuple(layer[path] for layer in captured))
