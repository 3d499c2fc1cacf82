"""`commit_path`: a cycle's commit bookkeeping after the verify (the accepted path's cache slots, the tokens the
drafter ingests, what the host reads, the path's captured features, the new root), in one launch.

Dispatch: the Triton kernel when `use_triton(accepted_nodes)`, else the reference (tests/kernels/
test_path_commit.py checks that both compute the same function).
"""
from typing import Sequence

import torch

from specdraft.kernels import use_triton
from specdraft.kernels.path_commit.reference import CommittedPath, commit_path_reference


def commit_path(accepted_nodes: torch.Tensor, accept_length: torch.Tensor, bonus: torch.Tensor,
                tree_tokens: torch.Tensor, prefix_len: torch.Tensor, captured: Sequence[torch.Tensor],
                root: torch.Tensor) -> CommittedPath:
    """accepted_nodes [D + 1], accept_length, bonus, prefix_len [1], tree_tokens [N] (int64); captured [N, H]
    each; root [1], set to the bonus in place -> CommittedPath (reference.py)."""
    if use_triton(accepted_nodes, "path_commit"):
        from specdraft.kernels.path_commit.triton_kernel import commit_path_triton

        return commit_path_triton(accepted_nodes, accept_length, bonus, tree_tokens, prefix_len, captured, root)
    return commit_path_reference(accepted_nodes, accept_length, bonus, tree_tokens, prefix_len, captured, root)


__all__ = ["CommittedPath", "commit_path", "commit_path_reference"]
