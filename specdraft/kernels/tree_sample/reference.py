"""Rejection-sampling acceptance over a draft tree, the spec (the rule: decoding/sampling.py's docstring).

Every node's test is evaluated at once (a node's uniform is its own, and the mass its earlier siblings hold does not
depend on the walk), then the path through the first passing child of each node is read off the tree's ancestry,
and the bonus is drawn by inverse CDF from what the last node's distribution leaves once its rejected point-mass
children are banned. Sampled drafts (`rows`, `logprobs`, `d2t`, `sampled`; all None for point-mass drafts): a
node's sampled child is tested first with min(1, p / q), its point-mass children against the residual
max(0, p - q) renormalised."""
from typing import Optional, Tuple

import torch

from specdraft.kernels.temperature import scaled_logits


def target_probs_of(target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """target_logits [N, V] -> softmax(logits / T) [N, V] float32."""
    return torch.softmax(scaled_logits(target_logits, temperature), dim=-1, dtype=torch.float32)


def _ban_rejected(probs: torch.Tensor, tokens: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """probs [V] without the tokens of the rejected nodes: tokens [N], rejected [N] bool -> [V] (unnormalised)."""
    hits = torch.zeros_like(probs).index_add_(0, tokens, rejected.to(probs.dtype))  # [V] > 0 where banned
    return torch.where(hits > 0, 0.0, probs)


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights [V] >= 0 (unnormalised), uniform [1] -> [1] int64 index drawn with probability weights / sum."""
    cdf = torch.cumsum(weights, dim=0)  # [V]
    return torch.searchsorted(cdf, uniform * cdf[-1:], right=True).clamp(max=weights.shape[0] - 1)


def _draft_probs(rows: torch.Tensor, logprobs: torch.Tensor, d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    """rows [N] (each node's row of logprobs [R, Vd], -1: none) -> Q [N, V] float32: each node's draft distribution
    q over the target vocabulary (0 outside the draft vocabulary, and for nodes that were not expanded)."""
    expanded = rows >= 0  # [N]
    q = logprobs.index_select(0, rows.clamp(min=0)).exp() * expanded[:, None]  # [N, Vd]
    target_ids = torch.arange(q.shape[1], device=q.device) + d2t  # [Vd]
    return torch.zeros(q.shape[0], vocab, device=q.device).index_copy_(1, target_ids, q)  # [N, V]


def _child_tests(target_probs: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                 rows: Optional[torch.Tensor] = None, logprobs: Optional[torch.Tensor] = None,
                 d2t: Optional[torch.Tensor] = None, sampled: Optional[torch.Tensor] = None):
    """-> (child_probs [N]: each node's probability under the distribution its parent tests point masses
    against, sampled [N] bool: nodes drafted by sampling, ratios [N]: p / q of a sampled node at its parent,
    bases [N, V]: per node, that distribution (unnormalised)). Without sampled drafts the point masses are tested
    against the target's p; with them, against the residual max(0, p - q) of a parent whose sampled child is in
    the tree (the sampled child is tested first, min(1, p / q))."""
    clamped = parents.clamp(min=0)
    if sampled is None:
        return target_probs[clamped, tokens], torch.zeros_like(tokens, dtype=torch.bool), None, target_probs
    sampled = sampled & (parents >= 0)  # [N]
    draft_probs = _draft_probs(rows, logprobs, d2t, target_probs.shape[1])  # [N, V]
    tests_sampled = torch.zeros_like(target_probs[:, 0]).index_add_(0, clamped, sampled.float()) > 0  # [N]
    bases = torch.where(tests_sampled[:, None], (target_probs - draft_probs).clamp(min=0), target_probs)  # [N, V]
    bases = bases / bases.sum(dim=-1, keepdim=True).clamp(min=1e-30)
    ratios = target_probs[clamped, tokens] / draft_probs[clamped, tokens].clamp(min=1e-30)  # [N]
    return bases[clamped, tokens], sampled, ratios, bases


def _earlier_siblings(parents: torch.Tensor) -> torch.Tensor:
    """parents [N] -> [N, N] bool: node j shares node i's parent and comes before it (siblings are tested in node
    order, the draft's rank order)."""
    index = torch.arange(parents.shape[0], device=parents.device)  # [N]
    return (parents[:, None] == parents[None, :]) & (index[None, :] < index[:, None])


def _first_passing(passes: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """passes [N] bool, earlier [N, N] (`_earlier_siblings`) -> [N] bool: the node passes its test and no sibling
    before it does (the child a walk at its parent would take)."""
    return passes & ~(earlier & passes[None, :]).any(dim=1)


def _remaining_mass(probs: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """probs [N] of point-mass children (0 elsewhere), earlier [N, N] (`_earlier_siblings`) -> [N]: the mass p_i
    still holds when node i is tested, 1 - (sum of the probabilities of its siblings ranked before it)."""
    return 1.0 - earlier.to(probs.dtype) @ probs


def _accepted_path(taken: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                   depth_limit: int) -> torch.Tensor:
    """taken [N] bool (`_first_passing`) -> accepted_nodes [depth_limit + 1] (-1 padded): the walk from the root
    through taken children, found without walking: a node is on it when it and each of its ancestors but the root
    were taken (checked by pointer jumping up the parents, ceil(log2(depth_limit + 1)) rounds), at a depth within
    the limit; at most one node a depth is, and it goes to its depth's place."""
    index = torch.arange(taken.shape[0], device=taken.device)  # [N]
    on_path = taken | (index == 0)  # [N] so far: itself (the root is always on the path)
    above = parents.clamp(min=0)  # [N] the ancestor the next round reads (padding and the root: the root)
    for _ in range(max(1, depth_limit).bit_length()):  # round r covers 2^r ancestors
        on_path = on_path & on_path.index_select(0, above)
        above = above.index_select(0, above)
    on_path = on_path & (depths <= depth_limit)  # [N]
    places = torch.where(on_path, depths, depth_limit + 1)  # [N] off the path: one place past the end
    path = torch.full((depth_limit + 2,), -1, dtype=torch.long, device=taken.device).scatter_(0, places, index)
    return path[:depth_limit + 1]


def verify_sampled_reference(target_logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                             depths: torch.Tensor, uniforms: torch.Tensor, depth_limit: int, temperature: float,
                             rows: Optional[torch.Tensor] = None, logprobs: Optional[torch.Tensor] = None,
                             d2t: Optional[torch.Tensor] = None,
                             sampled: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [N, V]; tokens, parents, depths [N] int64 (parents[0] = -1; -1 also marks padding);
    uniforms [N + 1] in [0, 1) (one per node, for its test as a child, then the bonus's); with sampled drafts, rows
    [N] int64 (each node's row of logprobs [R, Vd] float32 log q, -1: not expanded), d2t [Vd] int64 (target id =
    draft index + d2t) and sampled [N] bool (the node was sampled from its parent's q) -> (accepted_nodes
    [depth_limit + 1] int64 (-1 padded), accept_length [1] int64, bonus [1] int64). Static shapes, no host sync."""
    target_probs = target_probs_of(target_logits, temperature)  # [N, V]
    child_probs, sampled, ratios, bases = _child_tests(target_probs, tokens, parents, rows, logprobs, d2t, sampled)
    point_mass = (parents >= 0) & ~sampled  # [N] (padding's parent is -1: no node's child)
    earlier = _earlier_siblings(parents)  # [N, N]
    probs = torch.where(point_mass, child_probs, 0.0)  # [N]
    remaining = _remaining_mass(probs, earlier)  # [N] the mass p_i holds when node i is tested
    passes = point_mass & (uniforms[:-1] * remaining < probs)  # [N]
    if ratios is not None:
        passes = passes | (sampled & (uniforms[:-1] < ratios))
    accepted_nodes = _accepted_path(_first_passing(passes, earlier), parents, depths, depth_limit)  # [D + 1]
    accept_length = (accepted_nodes[1:] >= 0).sum(dim=0, keepdim=True)  # [1]
    node = accepted_nodes.index_select(0, accept_length)  # [1] the walk's last node
    rejected = (parents == node) & point_mass  # [N] every point-mass child of the last node was rejected
    weights = _ban_rejected(bases.index_select(0, node)[0], tokens, rejected)  # [V] (no host read)
    bonus = _inverse_cdf(weights, uniforms[-1:])  # [1]
    return accepted_nodes, accept_length, bonus
