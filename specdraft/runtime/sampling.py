"""Lossless sampling at temperature T > 0.

The tree's children are chosen deterministically (the draft's top-k), so each is a point-mass proposal. At a
node with target distribution p and children c_1..c_k (in draft rank order), child c_i is accepted with
probability p_i(c_i), where p_1 = p and p_{i+1} is p_i with c_i removed and renormalised; if every child is
rejected, the bonus token is sampled from p_{k+1}. Then P(output = c_j) = p(c_j) and P(output = x) = p(x) for
any other x: the output has exactly the target's distribution (recursive rejection sampling, as in SpecInfer,
with point-mass drafts). The walk continues from an accepted child; a leaf's bonus is sampled from its p.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from specdraft.runtime.tree import DraftTree


def sample_token(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator] = None,
                 banned: Optional[List[int]] = None) -> torch.Tensor:
    """logits [1, V] -> [1] int64: argmax at T=0, else a sample of softmax(logits / T) without `banned` ids."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits[0].float() / temperature, dim=-1)  # [V]
    if banned:
        probs[torch.tensor(banned, device=probs.device)] = 0.0
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.cpu(), 1, generator=generator).to(logits.device)
    return torch.multinomial(probs, 1, generator=generator)


def _uniform(generator: Optional[torch.Generator]) -> float:
    device = generator.device if generator is not None else "cpu"
    return float(torch.rand(1, generator=generator, device=device))


def _children(parents: List[int], valid: List[bool]) -> List[List[int]]:
    kids: List[List[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0 and valid[node]:
            kids[parent].append(node)
    return kids


def verify_sampling(target_logits: torch.Tensor, tree: DraftTree, depth_limit: int, temperature: float,
                    generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [N, V] -> (accepted_nodes [depth_limit + 1] (-1 padded), accept_length [1], bonus [1])."""
    device = target_logits.device
    target_probs = torch.softmax(target_logits.float() / temperature, dim=-1)  # [N, V]
    tokens = tree.tokens.tolist()
    kids = _children(tree.parents.tolist(), tree.valid.tolist())
    child_probs = target_probs[tree.parents.clamp(min=0), tree.tokens].tolist()  # p_parent(token) per node
    path, node, rejected = [0], 0, []
    while True:
        remaining, accepted_child, rejected = 1.0, None, []
        for child in kids[node]:
            if _uniform(generator) * remaining < child_probs[child]:
                accepted_child = child
                break
            remaining -= child_probs[child]
            rejected.append(tokens[child])
        if accepted_child is None:
            break
        path.append(accepted_child)
        node = accepted_child
    bonus = sample_token(target_logits[node:node + 1], temperature, generator, banned=rejected)
    accepted = torch.full((depth_limit + 1,), -1, dtype=torch.long)
    accepted[:len(path)] = torch.tensor(path)
    return accepted.to(device), torch.tensor([len(path) - 1], device=device), bonus.to(device).view(1)
