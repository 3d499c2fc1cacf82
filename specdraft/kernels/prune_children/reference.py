"""The spec of a tree scorer's pruning (C2T's, decoding/tree.py after each depth's expansion): p expanded parents'
top-k children, each scored by a two-layer FFN (ReLU, one logit) over three (or six) features, the children scored
under a cut dropped (their log-probabilities -inf). The features of a child: its joint probability (the product of
the draft's probabilities from the root), the entropy of its parent's draft distribution over its `top` most
probable tokens (kernels.top_entropy) and its depth; in the extended set (a first layer of six columns) also its own
draft probability, its parent's joint probability and its rank among its parent's children. `child_inputs` and
`ffn_features` are what a trace records and what training reads (specdraft.methods.c2t): the runtime scores the same
numbers."""
from typing import NamedTuple, Optional, Tuple

import torch

from specdraft.kernels.top_entropy import top_entropy


PAPER_FEATURES = 3  # joint probability, parent entropy, depth
EXTENDED_FEATURES = 6  # those, then the child's own draft probability, its parent's joint probability, its rank


class ScorerWeights(NamedTuple):
    hidden_weight: torch.Tensor  # [Hc, F] float32: the first layer's, over the features (ffn_features), F 3 or 6
    hidden_bias: torch.Tensor  # [Hc] float32
    out_weight: torch.Tensor  # [Hc] float32: the output layer's
    out_bias: torch.Tensor  # [1] float32
    cut: torch.Tensor  # [1] float32: the logit under which a child is dropped (logit(β))


def child_inputs(child_logprobs: torch.Tensor, parent_scores: torch.Tensor, parent_logits: torch.Tensor,
                 top: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """child_logprobs [p, k] (each parent's top-k children's draft log-probabilities), parent_scores [p] (each
    parent's joint log-probability), parent_logits [p, V] (the draft logits the children were drawn from) ->
    (joint_logprobs [p, k] float32, parent_entropy [p] float32 over the top `top`)."""
    joint = parent_scores.float()[:, None] + child_logprobs.float()  # [p, k]
    return joint, top_entropy(parent_logits, top)


def ffn_features(joint_logprobs: torch.Tensor, parent_entropy: torch.Tensor, depths: torch.Tensor,
                 own_logprobs: Optional[torch.Tensor] = None, parent_logprobs: Optional[torch.Tensor] = None,
                 ranks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """joint_logprobs, parent_entropy, depths [n] (broadcastable) -> [n, 3] float32: joint probability (linear),
    parent entropy, depth (1-based); with own_logprobs, parent_logprobs and ranks (the extended set) [n, 6]: also
    the child's own draft probability, its parent's joint probability and its rank among its parent's children as
    drafted (0: the first, the most probable at T=0)."""
    parts = [joint_logprobs.float(), parent_entropy.float(), depths.float()]
    if own_logprobs is not None:
        parts += [own_logprobs.float(), parent_logprobs.float(), ranks.float()]
    parts = torch.broadcast_tensors(*parts)
    linear = [part.exp() if index in (0, 3, 4) else part for index, part in enumerate(parts)]  # probabilities
    return torch.stack(linear, dim=-1)


def ffn_logits(features: torch.Tensor, weights: ScorerWeights) -> torch.Tensor:
    """features [..., 3] -> [...] the FFN's logits."""
    hidden = torch.relu(features @ weights.hidden_weight.T + weights.hidden_bias)  # [..., Hc]
    return hidden @ weights.out_weight + weights.out_bias


def prune_children_reference(child_logprobs: torch.Tensor, parent_scores: torch.Tensor, parent_logits: torch.Tensor,
                             depth: int, weights: ScorerWeights, top: int) -> torch.Tensor:
    """child_logprobs [p, k], parent_scores [p], parent_logits [p, V], depth (of the children, 1-based) ->
    [p, k] float32: child_logprobs, -inf where the FFN's logit is under weights.cut."""
    joint, entropy = child_inputs(child_logprobs, parent_scores, parent_logits, top)
    extended = () if weights.hidden_weight.shape[1] == PAPER_FEATURES else (
        child_logprobs, parent_scores[:, None], torch.arange(joint.shape[1], device=joint.device)[None, :])
    features = ffn_features(joint, entropy[:, None], torch.full_like(joint, depth), *extended)  # [p, k, F]
    keep = ffn_logits(features, weights) >= weights.cut
    return torch.where(keep, child_logprobs.float(), float("-inf"))
