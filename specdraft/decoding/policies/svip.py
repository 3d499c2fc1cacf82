"""The svip policy (SVIP, Zhang et al., arXiv:2411.18462): stop drafting once the newest draft's estimated
acceptance falls below `runtime.svip_threshold`. A draft is accepted with probability 1 - TV(p, q) >=
1 - sqrt(KL(p || q) / 2) (Pinsker); SVIP stands the draft distribution's entropy H(q) in for the divergence it
cannot see, so 1 - sqrt(H(q) / 2) estimates the newest draft's acceptance. Chains: after each draft; trees: once
the best of the newest depth's estimates falls below it (stopping.py). A research option (docs/runtime.md)."""
from __future__ import annotations

import torch

from specdraft.decoding.policies.stopping import StopPolicy
from specdraft.decoding.stop_rules import StopRule


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


def svip_policy(threshold: float) -> StopPolicy:
    return StopPolicy(EntropyStop(threshold))
