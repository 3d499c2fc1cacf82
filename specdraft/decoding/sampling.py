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

from specdraft.kernels.tree_sample import verify_sampled
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


def verify_sampling(target_logits: torch.Tensor, tree: DraftTree, depth_limit: int, temperature: float,
                    uniforms: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [N, V], uniforms [N + 1] (`draw_uniforms`) -> (accepted_nodes [depth_limit + 1] (-1
    padded), accept_length [1], bonus [1]). Static shapes, no host sync. With sampled drafts (`tree.sampled`),
    a node's sampled child is tested first with min(1, p / q) and its point-mass children against the residual
    (sampled_drafts.py). Every node's test is evaluated at once, then the path through the first passing child of
    each node is read off the tree's ancestry: a fixed number of launches whatever the depth
    (`kernels.tree_sample`)."""
    drafts = tree.sampled
    if drafts is None:
        return verify_sampled(target_logits, tree.tokens, tree.parents, tree.depths, uniforms, depth_limit,
                              temperature)
    return verify_sampled(target_logits, tree.tokens, tree.parents, tree.depths, uniforms, depth_limit, temperature,
                          drafts.rows, drafts.logprobs, drafts.d2t, drafts.sampled)


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
