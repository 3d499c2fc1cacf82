"""When a draft stops growing: a rule evaluated on the device after each depth, whose one bool the host reads
(chain.py for chains, depth_stop.py for trees). A stop never changes what the target accepts, only how much is
drafted and verified, so every rule is lossless; at T > 0 with sampled drafts a rule reads only what does not
depend on which token was sampled (a draft's top-1 score, its distribution), never the sampled token itself.

- `ConfidenceStop` (η, Kangaroo): the newest draft's top-1 probability below η. Chains.
- `EntropyStop` (SVIP, Zhang et al., arXiv:2411.18462): a draft is accepted with probability 1 - TV(p, q) >=
  1 - sqrt(KL(p || q) / 2) (Pinsker); SVIP stands the draft distribution's entropy H(q) in for the divergence it
  cannot see, so 1 - sqrt(H(q) / 2) estimates the newest draft's acceptance, and drafting stops once it falls
  below the threshold. Trees: once the best of the newest depth's estimates falls below it.
- `MassStop` (Dynamic Depth Decoding, Brown et al., arXiv:2409.00142): the draft probability of the whole
  drafted path (chains), or the summed joint probability of the tree's frontier (trees), below the threshold.
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


def acceptance_bound(logits: torch.Tensor) -> torch.Tensor:
    """logits [r, Vd] -> [r] float32: 1 - sqrt(H(q) / 2), SVIP's estimate of a draft's acceptance from its
    distribution's entropy (nats)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return 1.0 - (entropy / 2).sqrt()


class EntropyStop(StopRule):
    name = "svip"

    def chain(self, logits, logprob, path):
        return acceptance_bound(logits) < self.threshold

    def tree(self, logits, frontier_scores):
        return acceptance_bound(logits).amax(dim=0, keepdim=True) < self.threshold


class MassStop(StopRule):
    name = "ddd"

    def chain(self, logits, logprob, path):
        return path.sum(dim=0, keepdim=True) < math.log(self.threshold)

    def tree(self, logits, frontier_scores):
        return torch.logsumexp(frontier_scores, dim=0, keepdim=True) < math.log(self.threshold)
