"""Drafts sampled from the draft distribution at T > 0, so that the verify may test them against q.

With point-mass drafts (each child one of the draft's top-k tokens), a node's child c is accepted with probability
p(c) at most: at T = 1, where the target's p is spread, a chain's top-1 draft lands with p(top-1) alone. A draft
sampled from q and accepted with probability min(1, p(x) / q(x)) lands with probability sum_x min(p(x), q(x)) =
1 - TV(p, q), near 1 when the draft matches the target (Leviathan et al. 2023; SpecInfer's and EAGLE's rule for
sampled drafts). So here, at T > 0, every expanded node's first child is sampled from q (Gumbel-max, its noise
drawn outside the CUDA graph) and its other k - 1 children are q's most probable tokens besides it
(`kernels.sampled_topk`); the verify tests the sampled child against p with min(1, p / q), then the others as
point masses against the residual max(0, p - q) renormalised (sampling.py). Lossless because what decides whether
the sampled child is in the tree never reads which token it is: it scores as certain (its parent's joint score: a
draft near the target is accepted with probability 1 - TV, however flat q is, so q's own probabilities would
undervalue it; scored by them, the selection cut the sampled chain short and a tree accepted less than a chain),
above its siblings, ahead of them in node order; its siblings and descendants score no higher and come later, so
they cannot push it out. The tree then always holds the sampled chain to its full depth, and its point-mass
siblings by EAGLE-2's scores.
(A stop rule that reads the frontier's mass, Dynamic Depth Decoding's, sees the sampled chain as certain and does
not stop at T > 0.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class DraftDraws:
    """A cycle's randomness for sampled drafts: each expanded node's Exp(1) draws, drawn outside the graph; the
    Gumbel noise is -log of them, taken inside it (`kernels.sampled_topk`: two launches fewer outside the graph)."""

    temperature: float
    exponential: torch.Tensor  # [R, Vd] float32: row r perturbs the draft distribution of the r-th expanded node


@dataclass
class SampledDrafts:
    """What the verify needs of a tree with sampled drafts (sampling.py)."""

    rows: torch.Tensor  # [N] int64: each node's row in `logprobs` (the distribution its children came from), -1: none
    logprobs: torch.Tensor  # [R, Vd] float32: log q at the temperature, per expanded node
    d2t: torch.Tensor  # [Vd] int64: target id = draft index + d2t
    sampled: torch.Tensor  # [N] bool: the node was sampled from its parent's q (else a point-mass draft)


def draw_exponential(rows: int, draft_vocab: int, generator: Optional[torch.Generator],
                     device: torch.device) -> torch.Tensor:
    """-> [rows, draft_vocab] float32 Exp(1) draws on `device` (-log of one is a standard Gumbel draw)."""
    source = generator.device if generator is not None else device
    return torch.empty(rows, draft_vocab, device=source).exponential_(generator=generator).to(device)
