"""The ddd policy (Dynamic Depth Decoding, Brown et al., arXiv:2409.00142): stop drafting once the draft probability
of the whole drafted path (chains), or the summed joint probability of the tree's frontier (trees), falls below
`runtime.ddd_threshold` (stopping.py). A research option (docs/runtime.md)."""
from __future__ import annotations

import math

import torch

from specdraft.decoding.policies.stopping import StopPolicy
from specdraft.decoding.stop_rules import StopRule


class MassStop(StopRule):
    name = "ddd"

    def chain(self, logits, logprob, path):
        return path.sum(dim=0, keepdim=True) < math.log(self.threshold)

    def tree(self, logits, frontier_scores):
        return torch.logsumexp(frontier_scores, dim=0, keepdim=True) < math.log(self.threshold)


def ddd_policy(threshold: float) -> StopPolicy:
    return StopPolicy(MassStop(threshold))
