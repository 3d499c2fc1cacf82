"""When a draft stops growing: a rule evaluated on the device after each depth, whose one bool the host reads
(cycles/chain.py for chains, cycles/depth_stop.py for trees). A stop never changes what the target accepts, only
how much is drafted and verified, so every rule is lossless; at T > 0 with sampled drafts a rule reads only what
does not depend on which token was sampled (a draft's top-1 score, its distribution), never the sampled token
itself.

- `ConfidenceStop` (η, Kangaroo's exit): the newest draft's top-1 probability below η. Chains.
- The drafting policies' own: `policies.svip.EntropyStop`, `policies.ddd.MassStop`.
"""
from __future__ import annotations

import math

import torch


class StopRule:
    """One stop rule; `name` for messages, `threshold` its parameter."""

    name: str = ""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def chain(self, logits: torch.Tensor, logprob: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """A chain's newest draft: logits [1, Vd] of the distribution it came from, its score logprob [1] (the
        top-1 log-probability), path [d] the scores of the drafts so far, this one last -> [1] bool: stop before
        this draft."""
        raise NotImplementedError

    def tree(self, logits: torch.Tensor, frontier_scores: torch.Tensor) -> torch.Tensor:
        """A tree's newest depth: logits [k, Vd] of the distributions its candidates came from, frontier_scores
        [k] the joint log-probabilities of its frontier -> [1] bool: grow no deeper."""
        raise NotImplementedError


class ConfidenceStop(StopRule):
    name = "confidence"

    def chain(self, logits, logprob, path):
        return logprob < math.log(self.threshold)
