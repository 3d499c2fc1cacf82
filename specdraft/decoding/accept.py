"""Acceptance: which drafted tokens a cycle keeps, given the target's verify pass over the tree. One acceptance rule
serves every cycle kind and the evaluator (which decodes through the engine).

- `ExactGreedy` (T = 0): the deepest path whose every token is the target's argmax at its parent
  (`kernels.tree_verify`); the output is the target's greedy output.
- `RejectionSampling` (T > 0): recursive rejection sampling on the device (`sampling.py`); the output has the
  target's distribution.
- `JudgedGreedy` (T = 0, opt-in, lossy): a node is accepted if the target's argmax at its parent is its token
  **or** it is its parent's most probable child under the draft and the draft's `NodeJudge` scores the target's
  own state at the node above δ (Judge decoding, Bachmann et al., arXiv:2501.19309). At each depth the walk takes
  the exact child if there is one, else the judged one; the first node where neither passes ends the run. Only the
  draft's own choice is judged: that is the token a chain drafts and the one the judge's labels are mined on
  (methods/judge/mining.py); a tree's other children are candidates it never learned to score.

Every rule returns (accepted_nodes [depth_limit + 1] (-1 padded, node 0 the root), accept_length [1], bonus [1])
with static shapes and no host sync, so that a cycle stays one CUDA graph. A rule's randomness is drawn
outside the graph (`randomness`) and passed in as a tensor.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from specdraft.core.drafting import NodeJudge
from specdraft.core.errors import SpecdraftError
from specdraft.kernels.tree_verify import verify_greedy
from specdraft.decoding.sampling import draw_uniforms, verify_sampling
from specdraft.decoding.tree import DraftTree

Accepted = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # accepted_nodes [D + 1], accept_length [1], bonus [1]


class Acceptance:
    """The acceptance rule of a cycle. `key` names it among an engine's CUDA graphs."""

    key: str = "greedy"
    temperature: float = 0.0
    """The sampling temperature (0: greedy)."""
    lossless: bool = True
    """Whether the output keeps the target's own (greedy output or sampling distribution)."""
    reads_hidden: bool = False
    """Whether `accept` reads the target's last-layer states (before the final norm) at the tree's nodes."""

    def randomness(self, num_nodes: int, generator: Optional[torch.Generator],
                   device: torch.device) -> Optional[torch.Tensor]:
        """The cycle's random draws for `num_nodes` nodes, made outside any CUDA graph (None: it draws none)."""
        return None

    def accept(self, target_logits: torch.Tensor, tree: DraftTree, depth_limit: int,
               randomness: Optional[torch.Tensor] = None, target_hidden: Optional[torch.Tensor] = None) -> Accepted:
        """target_logits [N, V] of the verify pass, target_hidden [N, H] when `reads_hidden`."""
        raise NotImplementedError


class ExactGreedy(Acceptance):
    key = "greedy"

    def accept(self, target_logits, tree, depth_limit, randomness=None, target_hidden=None) -> Accepted:
        return verify_greedy(target_logits, tree.tokens, tree.parents, depth_limit)


class RejectionSampling(Acceptance):
    def __init__(self, temperature: float):
        self.temperature = temperature
        self.key = f"sampled@{temperature}"

    def randomness(self, num_nodes, generator, device):
        return draw_uniforms(num_nodes, generator, device)  # [num_nodes + 1]

    def accept(self, target_logits, tree, depth_limit, randomness=None, target_hidden=None) -> Accepted:
        return verify_sampling(target_logits, tree, depth_limit, self.temperature, randomness)


class JudgedGreedy(Acceptance):
    lossless = False
    reads_hidden = True

    def __init__(self, judge: NodeJudge):
        self.judge = judge
        self.key = f"judged@{judge.threshold}"

    def accept(self, target_logits, tree, depth_limit, randomness=None, target_hidden=None) -> Accepted:
        return verify_judged(target_logits, target_hidden, tree, depth_limit, self.judge)


def verify_judged(target_logits: torch.Tensor, target_hidden: torch.Tensor, tree: DraftTree, depth_limit: int,
                  judge: NodeJudge) -> Accepted:
    """target_logits [N, V], target_hidden [N, H] -> JudgedGreedy's walk (module docstring). Static shapes."""
    target_next = target_logits.argmax(-1)  # [N]
    has_parent = tree.parents >= 0  # the root and padding have none
    exact = has_parent & (tree.tokens == target_next[tree.parents.clamp(min=0)])  # [N]
    scores = judge.scores(target_hidden).float()  # [N]
    judged = has_parent & draft_choices(tree) & (scores > judge.threshold)
    rank = torch.where(exact, 2.0, torch.where(judged, scores, -1.0))  # exact first, then the judged one
    node = torch.zeros(1, dtype=torch.long, device=target_next.device)
    walking = torch.ones(1, dtype=torch.bool, device=target_next.device)
    accepted = [node]
    for _ in range(depth_limit):
        child_rank = torch.where(tree.parents == node, rank, -1.0)  # [N]
        best_rank, child = child_rank.max(dim=0, keepdim=True)  # [1], [1]
        step = walking & (best_rank >= 0)
        accepted.append(torch.where(step, child, -1))
        node = torch.where(step, child, node)
        walking = step
    accepted_nodes = torch.cat(accepted)  # [depth_limit + 1]
    return accepted_nodes, (accepted_nodes[1:] >= 0).sum(dim=0, keepdim=True), target_next.index_select(0, node)


def draft_choices(tree: DraftTree) -> torch.Tensor:
    """[N] bool: the node is its parent's most probable child under the draft (the highest joint log-probability
    among its valid siblings; ties all count). The root and padding are not."""
    parents = tree.parents.clamp(min=0)  # [N]
    candidate = (tree.parents >= 0) & tree.valid
    logprobs = torch.where(candidate, tree.joint_logprobs.float(), float("-inf"))  # [N]
    best = torch.full_like(logprobs, float("-inf")).scatter_reduce(0, parents, logprobs, "amax")  # [N] per parent
    return candidate & (logprobs >= best.index_select(0, parents))


def acceptance_for(temperature: float, judge: Optional[NodeJudge] = None) -> Acceptance:
    """The acceptance rule of a cycle at `temperature`: the judge's when one is given (greedy only), else exact."""
    if judge is not None:
        if temperature > 0:
            raise SpecdraftError(f"learned acceptance (a judge threshold) decodes greedily; got temperature "
                                 f"{temperature}: use 0, or leave the judge off")
        return JudgedGreedy(judge)
    return RejectionSampling(temperature) if temperature > 0 else ExactGreedy()
