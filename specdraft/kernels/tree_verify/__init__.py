"""`verify_greedy`: the accepted path, its length and the bonus token of a tree checked at T=0."""
import torch

from specdraft.kernels.tree_verify.reference import verify_greedy_reference


def verify_greedy(target_logits: torch.Tensor, tree_tokens: torch.Tensor, parents: torch.Tensor, depth_limit: int):
    """target_logits [N, V]; tree_tokens, parents [N] -> (accepted_nodes [depth_limit+1], accept_length [1],
    bonus_token [1])."""
    return verify_greedy_reference(target_logits, tree_tokens, parents, depth_limit)


__all__ = ["verify_greedy", "verify_greedy_reference"]
