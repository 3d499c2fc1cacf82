"""Lossless sampling at temperature T > 0.

Point-mass drafts: a child chosen deterministically (one of the draft's top-k) is a point-mass proposal. At a
node with target distribution p and children c_1..c_k (in draft rank order), child c_i is accepted with
probability p_i(c_i), where p_1 = p and p_{i+1} is p_i with c_i removed and renormalised; if every child is
rejected, the bonus token is sampled from p_{k+1}. Then P(output = c_j) = p(c_j) and P(output = x) = p(x) for
any other x: the output has exactly the target's distribution (recursive rejection sampling, as in SpecInfer,
with point-mass drafts). The walk continues from an accepted child; a leaf's bonus is sampled from its p.
Sampled drafts (sampled_drafts.py): a node's first child was sampled from the draft's q; it is tested first and
accepted with probability min(1, p(c) / q(c)); if rejected, the node's point-mass children are tested as above
against the residual r = max(0, p - q) renormalised instead of p, and the bonus comes from what r leaves: the
standard speculative-sampling step followed by the point-mass rule on its residual, lossless for the same
reasons.

`verify_sampling` runs the walk on the device with static shapes and no host sync, so that the whole T > 0
cycle is captured in one CUDA graph like the greedy one. Its randomness comes in as a tensor of uniforms (one
per node, for the test of that node as a child, and one for the bonus), drawn by the caller from its generator
outside the graph. The sequential rule "accept c_i if u_i * (1 - p(c_1) - ... - p(c_{i-1})) < p(c_i)" is
evaluated for every node at once (p(c_1) + ... + p(c_{i-1}) summed over each node's earlier siblings); the first
child that passes is accepted, and the accepted path is read off the tree's ancestry, with no walk depth by depth.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from specdraft.decoding.sampled_drafts import SampledDrafts, scaled_logits
from specdraft.decoding.tree import DraftTree


def sample_token(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator] = None,
                 banned: Optional[List[int]] = None) -> torch.Tensor:
    """logits [1, V] -> [1] int64: argmax at T=0, else a sample of softmax(logits / T) without `banned` ids."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits[0].float() / temperature, dim=-1)  # [V]
    if banned:
        probs[torch.tensor(banned, device=probs.device)] = 0.0
    if generator is not None and generator.device.type != probs.device.type:
        return torch.multinomial(probs.cpu(), 1, generator=generator).to(logits.device)
    return torch.multinomial(probs, 1, generator=generator)


def draw_uniforms(num_nodes: int, generator: Optional[torch.Generator], device: torch.device) -> torch.Tensor:
    """-> [num_nodes + 1] float32 uniforms in [0, 1) for `verify_sampling`, on `device`."""
    source = generator.device if generator is not None else device
    return torch.rand(num_nodes + 1, generator=generator, device=source).to(device)


def _ban_rejected(probs: torch.Tensor, tokens: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """probs [V] without the tokens of the rejected nodes: tokens [N], rejected [N] bool -> [V] (unnormalised)."""
    hits = torch.zeros_like(probs).index_add_(0, tokens, rejected.to(probs.dtype))  # [V] > 0 where banned
    return torch.where(hits > 0, 0.0, probs)


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights [V] >= 0 (unnormalised), uniform [1] -> [1] int64 index drawn with probability weights / sum."""
    cdf = torch.cumsum(weights, dim=0)  # [V]
    return torch.searchsorted(cdf, uniform * cdf[-1:], right=True).clamp(max=weights.shape[0] - 1)


def _draft_probs(drafts: SampledDrafts, vocab: int) -> torch.Tensor:
    """drafts -> Q [N, V] float32: each node's draft distribution q over the target vocabulary (0 outside the
    draft vocabulary, and for nodes that were not expanded)."""
    expanded = drafts.rows >= 0  # [N]
    q = drafts.logprobs.index_select(0, drafts.rows.clamp(min=0)).exp() * expanded[:, None]  # [N, Vd]
    target_ids = torch.arange(q.shape[1], device=q.device) + drafts.d2t  # [Vd]
    return torch.zeros(q.shape[0], vocab, device=q.device).index_copy_(1, target_ids, q)  # [N, V]


def _child_tests(target_probs: torch.Tensor, tree: DraftTree):
    """-> (child_probs [N]: each node's probability under the distribution its parent tests point masses
    against, sampled [N] bool: nodes drafted by sampling, ratios [N]: p / q of a sampled node at its parent,
    bases [N, V]: per node, that distribution (unnormalised)). Without sampled drafts the point masses are tested
    against the target's p; with them, against the residual max(0, p - q) of a parent whose sampled child is in
    the tree (the sampled child is tested first, min(1, p / q))."""
    parents = tree.parents.clamp(min=0)
    if tree.sampled is None:
        return target_probs[parents, tree.tokens], torch.zeros_like(tree.valid), None, target_probs
    sampled = tree.sampled.sampled & (tree.parents >= 0)  # [N]
    draft_probs = _draft_probs(tree.sampled, target_probs.shape[1])  # [N, V]
    tests_sampled = torch.zeros_like(target_probs[:, 0]).index_add_(0, parents, sampled.float()) > 0  # [N]
    bases = torch.where(tests_sampled[:, None], (target_probs - draft_probs).clamp(min=0), target_probs)  # [N, V]
    bases = bases / bases.sum(dim=-1, keepdim=True).clamp(min=1e-30)
    ratios = target_probs[parents, tree.tokens] / draft_probs[parents, tree.tokens].clamp(min=1e-30)  # [N]
    return bases[parents, tree.tokens], sampled, ratios, bases


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


def _accepted_path(taken: torch.Tensor, tree: DraftTree, depth_limit: int) -> torch.Tensor:
    """taken [N] bool (`_first_passing`) -> accepted_nodes [depth_limit + 1] (-1 padded): the walk from the root
    through taken children, found without walking: a node is on it when it and each of its ancestors but the root
    were taken (checked by pointer jumping up the parents, ceil(log2(depth_limit + 1)) rounds), at a depth within
    the limit; at most one node a depth is, and it goes to its depth's place."""
    index = torch.arange(taken.shape[0], device=taken.device)  # [N]
    on_path = taken | (index == 0)  # [N] so far: itself (the root is always on the path)
    above = tree.parents.clamp(min=0)  # [N] the ancestor the next round reads (padding and the root: the root)
    for _ in range(max(1, depth_limit).bit_length()):  # round r covers 2^r ancestors
        on_path = on_path & on_path.index_select(0, above)
        above = above.index_select(0, above)
    on_path = on_path & (tree.depths <= depth_limit)  # [N]
    places = torch.where(on_path, tree.depths, depth_limit + 1)  # [N] off the path: one place past the end
    path = torch.full((depth_limit + 2,), -1, dtype=torch.long, device=taken.device).scatter_(0, places, index)
    return path[:depth_limit + 1]


def verify_sampling(target_logits: torch.Tensor, tree: DraftTree, depth_limit: int, temperature: float,
                    uniforms: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [N, V], uniforms [N + 1] (`draw_uniforms`) -> (accepted_nodes [depth_limit + 1] (-1
    padded), accept_length [1], bonus [1]). Static shapes, no host sync. With sampled drafts (`tree.sampled`),
    a node's sampled child is tested first with min(1, p / q) and its point-mass children against the residual
    (sampled_drafts.py). Every node's test is evaluated at once (a node's uniform is its own, and the mass its
    earlier siblings hold does not depend on the walk), then the path through the first passing child of each
    node is read off the tree's ancestry: a fixed number of launches whatever the depth."""
    target_probs = torch.softmax(scaled_logits(target_logits, temperature), dim=-1, dtype=torch.float32)  # [N, V]
    child_probs, sampled, ratios, bases = _child_tests(target_probs, tree)  # [N], [N], [N] or None, [N, V]
    point_mass = (tree.parents >= 0) & ~sampled  # [N] (padding's parent is -1: no node's child)
    earlier = _earlier_siblings(tree.parents)  # [N, N]
    probs = torch.where(point_mass, child_probs, 0.0)  # [N]
    remaining = _remaining_mass(probs, earlier)  # [N] the mass p_i holds when node i is tested
    passes = point_mass & (uniforms[:-1] * remaining < probs)  # [N]
    if ratios is not None:
        passes = passes | (sampled & (uniforms[:-1] < ratios))
    accepted_nodes = _accepted_path(_first_passing(passes, earlier), tree, depth_limit)  # [depth_limit + 1]
    accept_length = (accepted_nodes[1:] >= 0).sum(dim=0, keepdim=True)  # [1]
    node = accepted_nodes.index_select(0, accept_length)  # [1] the walk's last node
    rejected = (tree.parents == node) & point_mass  # [N] every point-mass child of the last node was rejected
    weights = _ban_rejected(bases.index_select(0, node)[0], tree.tokens, rejected)  # [V] (no host read)
    bonus = _inverse_cdf(weights, uniforms[-1:])  # [1]
    return accepted_nodes, accept_length, bonus


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """scores [B, V] float32 (logits / T) -> the same with every token outside the nucleus at -inf: Hugging Face's
    top-p rule, operation for operation (sorted ascending, a token goes when the mass up to and including it is
    <= 1 - top_p; the most likely token always stays). top_p >= 1 keeps every token."""
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=False)  # [B, V]
    remove = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1) <= 1 - top_p  # [B, V]
    remove[:, -1] = False
    return scores.masked_fill(remove.scatter(1, order, remove), -float("inf"))


def sample_rows(logits: torch.Tensor, temperature: float, top_p: float,
                uniforms: Optional[torch.Tensor]) -> torch.Tensor:
    """logits [B, V] -> [B] int64: argmax at T=0 (uniforms unused), else one draw per row from softmax(top-p
    filtered logits / T), by inverse CDF from uniforms [B] in [0, 1): the distribution of Hugging Face's
    `generate(do_sample=True, temperature=T, top_p=top_p, top_k=0)`. Static shapes, no host sync (graph-safe)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(top_p_filter(logits.float() / temperature, top_p), dim=-1)  # [B, V]
    cdf = torch.cumsum(probs, dim=-1)  # [B, V]
    picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)  # [B, 1]
    return picks[:, 0].clamp(max=logits.shape[-1] - 1)
