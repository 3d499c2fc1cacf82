"""The EAGLE-2 dynamic draft tree (Li et al., arXiv:2406.16858), with static shapes.

Expansion: depth 1 takes the draft's top-k tokens after the root. At each later depth the k frontier nodes
with the highest joint probability (the product of the draft probabilities along their path) each propose
their top-k children; of those k*k children the k best by joint probability become the next frontier. After
`depth` levels every proposed token is a candidate; the `budget - 1` candidates with the highest joint
probability (plus the root) form the tree that the target verifies. A child's joint probability never exceeds
its parent's, so the kept set is closed under ancestors (ties are repaired explicitly). A budget of every candidate
(`shape.num_candidates`) verifies the whole expansion, no rerank (how C2T's traces see what the target accepts).

A chain of k drafts is the same procedure with top-1 at each depth and budget k + 1.

Candidate states (`keep_states`, for a drafter whose verify may start above the target's shallow layers): after
`first` and after each `step`, the drafter runs the depth's new candidates (all of them, not just the frontier:
any may be selected) through its shallow layers with its own `tree_candidates` hook, each attending to its
root-to-node path; the tree then records which candidate each node is (`candidate_ids`), so that the verify
can start from those states (engine.py, `tree_verify_states`).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from specdraft.core.drafting import Drafter, TreeScorer
from specdraft.core.errors import SpecdraftError
from specdraft.kernels.draft_topk import draft_topk
from specdraft.kernels.tree_attention import MAX_WINDOW
from specdraft.kernels.tree_frontier import advance_frontier
from specdraft.kernels.top_entropy import top_entropy
from specdraft.kernels.tree_select import TreeSelection, ancestry, select_tree


logger = logging.getLogger(__name__)
CHAIN_DEPTH = 6
"""A chain's drafts when none are asked for."""
ENTROPY_TOP = 1000
"""M: a tree scorer reads the entropy of a parent's draft distribution over its M most probable tokens (C2T)."""


@dataclass(frozen=True)
class TreeShape:
    depth: int = 5
    """Drafted tokens on the longest path. The defaults (5, 8, 40) were the fastest of five shapes on SmolLM2
    with two EAGLE-3 heads (docs/benchmarks.md, runtime suite); (6, 8, 48) accepts more but costs more a cycle."""
    topk: int = 8
    """Children proposed per expanded node, and nodes expanded per depth."""
    budget: int = 40
    """Nodes the target verifies, the root included."""

    def validated(self) -> "TreeShape":
        if self.depth < 1 or self.topk < 1:
            raise SpecdraftError(f"tree depth and topk must be >= 1, got depth={self.depth} topk={self.topk}")
        if not 2 <= self.budget <= self.num_candidates:
            raise SpecdraftError(f"tree budget must be in 2..{self.num_candidates} for depth={self.depth} "
                                 f"topk={self.topk}, got {self.budget}")
        if max(self.budget, self.scratch) > MAX_WINDOW:
            logger.warning("tree depth=%d topk=%d budget=%d: the verify's %d nodes and the draft's %d scratch slots "
                           "must each be <= %d for the tree-attention kernel; beyond, attention runs its PyTorch "
                           "reference (depth 8, top-8 drafted 1.7x slower a cycle on an H100)", self.depth,
                           self.topk, self.budget, self.budget, self.scratch, MAX_WINDOW)
        return self

    @classmethod
    def chain(cls, num_draft: int) -> "TreeShape":
        return cls(depth=num_draft, topk=1, budget=num_draft + 1)

    @property
    def num_candidates(self) -> int:  # root + depth-1 tokens + k*k per later depth
        return 1 + self.topk + (self.depth - 1) * self.topk * self.topk

    @property
    def scratch(self) -> int:  # draft scratch slots: root + k per expanded depth
        return 1 + self.depth * self.topk


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [N] target ids; node 0 is the root
    parents: torch.Tensor  # [N] parent node index, -1 for the root and for padding
    depths: torch.Tensor  # [N] 0 for the root
    valid: torch.Tensor  # [N] bool: False for padding (when ties removed candidates)
    tree_mask: torch.Tensor  # [N, N] bool: node i sees node j (j is i or an ancestor)
    joint_logprobs: torch.Tensor  # [N] draft log-probability of the path to each node (0 for the root)
    candidate_ids: Optional[torch.Tensor] = None  # [N] ascending: each node's index among the candidates


class _TreeConstants(NamedTuple):
    """What a tree's expansion reads that depends on its shape alone, built once per shape and device (each a
    launch or two a cycle otherwise)."""
    root_score: torch.Tensor  # [1] float32 0: the root's joint log-probability
    root_parent: torch.Tensor  # [1] int64 -1
    first_parents: torch.Tensor  # [k] int64 0: depth 1 hangs under the root
    first_ids: torch.Tensor  # [k] int64 1..k: depth 1's candidate indices
    first_visible: torch.Tensor  # [k, W] bool: depth 1's node j sees scratch slot 0 (the root) and its own, 1 + j
    slots_by_depth: torch.Tensor  # [D-1, k] int64: depth d's scratch slots (row d - 1)
    depth_offsets: torch.Tensor  # [D-1] int64 1..D-1: depth d's position past the root's


@functools.lru_cache(maxsize=32)
def _tree_constants(shape: TreeShape, device: torch.device) -> _TreeConstants:
    k, long = shape.topk, dict(dtype=torch.long, device=device)
    slots_by_depth = 1 + torch.arange((shape.depth - 1) * k, **long).view(-1, k)
    columns, first_ids = torch.arange(shape.scratch, **long), torch.arange(1, 1 + k, **long)  # [W], [k]
    return _TreeConstants(
        root_score=torch.zeros(1, device=device), root_parent=torch.full((1,), -1, **long),
        first_parents=torch.zeros(k, **long), first_ids=first_ids,
        first_visible=(columns == 0) | (columns == first_ids[:, None]),  # depth 1's scratch slots are 1..k too
        slots_by_depth=slots_by_depth,
        depth_offsets=torch.arange(1, shape.depth, **long))


def _paths_of_children(parent_paths: torch.Tensor, first: int, per_parent: int) -> torch.Tensor:
    """parent_paths [p, C] bool (the candidates from the root to each parent) -> [p * per_parent, C], the paths
    of their children, numbered first, first + 1, ... (per_parent consecutive ones per parent): the parent's path
    and the child itself."""
    paths = parent_paths.repeat_interleave(per_parent, dim=0)  # [c, C]
    own = first + torch.arange(paths.shape[0], device=paths.device)  # [c]
    return paths | (torch.arange(paths.shape[1], device=paths.device)[None, :] == own[:, None])


def parent_entropy(draft_logits: torch.Tensor, top: int = ENTROPY_TOP) -> torch.Tensor:
    """draft_logits [k, Vd] -> [k] float32: the entropy of each row's draft distribution over its `top` most
    probable tokens (renormalised), what a TreeScorer reads of a candidate's parent (kernels.top_entropy)."""
    return top_entropy(draft_logits, top)


def _scored(scorer: Optional[TreeScorer], child_logprobs: torch.Tensor, parent_scores: torch.Tensor,
            draft_logits: torch.Tensor, depth: int) -> torch.Tensor:
    """child_logprobs [p, k] of p parents' top-k children -> the same with the children the scorer drops at -inf
    (their joint log-probabilities, and every descendant's, become -inf: pruned, never selected as real nodes)."""
    if scorer is None:
        return child_logprobs
    joint = parent_scores[:, None] + child_logprobs  # [p, k]
    entropy = parent_entropy(draft_logits)[:, None].expand_as(joint)  # [p, k]
    keep = scorer.keep(joint.flatten(), entropy.flatten(), depth).view_as(joint)
    return torch.where(keep, child_logprobs, float("-inf"))


def _expand(drafter: Drafter, shape: TreeShape, root: torch.Tensor, root_position: torch.Tensor,
            keep_states: bool = False, scorer: Optional[TreeScorer] = None):
    """Run the draft over `shape.depth` levels -> candidate tokens, parents (candidate index), joint scores.
    With keep_states, every candidate also goes through the drafter's `tree_candidates` (module docstring);
    with a scorer, the children it drops score -inf."""
    k, device, const = shape.topk, root.device, _tree_constants(shape, root.device)
    logits, hidden = drafter.first(root, root_position)  # [1, Vd], [1, Hd]
    scores, tokens = draft_topk(logits, drafter.d2t, k)  # [1, k]
    scores = _scored(scorer, scores, const.root_score, logits, 1)
    cand_tokens, cand_scores = [root, tokens[0]], [const.root_score, scores[0]]
    cand_parents = [const.root_parent, const.first_parents]
    frontier_tokens, frontier_scores, frontier_ids = tokens[0], scores[0], const.first_ids
    frontier_hidden = hidden.expand(k, -1)  # [k, Hd] each frontier node's parent output
    visible, slots_by_depth = const.first_visible, const.slots_by_depth  # [k, W]: the frontier's ancestors, itself
    position_by_depth = root_position + const.depth_offsets  # [D-1]
    if keep_states:
        root_path = torch.arange(shape.num_candidates, device=device)[None, :] == 0  # [1, C]
        frontier_paths = _paths_of_children(root_path, 1, k)  # [k, C] depth 1: every candidate is expanded
        lane = torch.arange(k, device=device)  # depth 1's frontier: all k candidates
        drafter.tree_candidates(frontier_tokens, (root_position + 1).expand(k), 1, frontier_paths, lane)
    for depth in range(1, shape.depth):
        slots = slots_by_depth[depth - 1]  # [k]
        positions = position_by_depth[depth - 1:depth].expand(k)  # [k]
        # [k, Vd], [k, Hd]
        logits, hidden = drafter.step(depth, frontier_hidden, frontier_tokens, positions, slots, visible)
        child_scores, child_tokens = draft_topk(logits, drafter.d2t, k)  # [k, k] each node's own children
        child_scores = _scored(scorer, child_scores, frontier_scores, logits, depth + 1)
        base = sum(t.shape[0] for t in cand_tokens)
        next_slots = 1 + depth * k if depth + 1 < shape.depth else None  # the next frontier's scratch slots
        frontier = advance_frontier(child_scores, child_tokens, frontier_scores, frontier_ids, base, hidden, visible,
                                    next_slots)
        cand_tokens.append(child_tokens.flatten())
        cand_scores.append(frontier.joint)  # [k * k] joint log-probabilities
        cand_parents.append(frontier.parents)
        frontier_scores, frontier_tokens, frontier_ids = frontier.scores, frontier.tokens, frontier.ids  # [k]
        frontier_hidden, visible, best = frontier.hidden, frontier.visible, frontier.best
        if keep_states:
            child_paths = _paths_of_children(frontier_paths, base, k)  # [k * k, C]
            drafter.tree_candidates(child_tokens.flatten(), (root_position + depth + 1).expand(k * k), base,
                                    child_paths, best)
            frontier_paths = child_paths[best]
    return torch.cat(cand_tokens), torch.cat(cand_parents), torch.cat(cand_scores)


def build_tree(drafter: Drafter, shape: TreeShape, root: torch.Tensor, root_position: torch.Tensor,
               keep_states: bool = False, scorer: Optional[TreeScorer] = None) -> DraftTree:
    """root [1] token, root_position [1] -> the tree the target verifies (budget nodes, static shapes);
    keep_states: the drafter keeps every candidate's shallow state (module docstring); scorer: drops candidates
    after each depth's expansion, and those selected anyway (fewer than the budget kept) become padding."""
    cand_tokens, cand_parents, cand_scores = _expand(drafter, shape, root, root_position, keep_states, scorer)
    select = _every_candidate if shape.budget == shape.num_candidates else select_tree
    selection = select(cand_tokens, cand_parents, cand_scores, shape.budget, shape.depth)
    tree = DraftTree(tokens=selection.tokens, parents=selection.parents, depths=selection.depths,
                     valid=selection.valid, tree_mask=selection.tree_mask, joint_logprobs=selection.joint_logprobs,
                     candidate_ids=selection.chosen)
    return tree if scorer is None else _pruned_as_padding(tree)


def _every_candidate(cand_tokens: torch.Tensor, cand_parents: torch.Tensor, cand_scores: torch.Tensor, budget: int,
                     max_depth: int) -> TreeSelection:
    """`select_tree` where the budget keeps every candidate: node i is candidate i (no sort, and no selection
    kernel, which is sized for the budgets trees are verified at)."""
    reach = ancestry(cand_parents, max_depth)  # [C, C]
    valid = reach[:, 0]
    eye = torch.eye(budget, dtype=torch.bool, device=reach.device)
    return TreeSelection(tokens=cand_tokens, parents=torch.where(valid, cand_parents, -1),
                         depths=torch.where(valid, reach.sum(1) - 1, 1), valid=valid,
                         tree_mask=reach & valid[:, None] | eye,
                         joint_logprobs=torch.where(valid, cand_scores, float("-inf")),
                         chosen=torch.arange(budget, device=reach.device))


def _pruned_as_padding(tree: DraftTree) -> DraftTree:
    """Nodes whose joint log-probability is -inf (dropped by the scorer, or under a dropped node) as the selection
    pads: under no parent, at depth 1, seeing themselves alone, never accepted."""
    pruned = ~torch.isfinite(tree.joint_logprobs)  # [N] (the root scores 0)
    eye = torch.eye(pruned.shape[0], dtype=torch.bool, device=pruned.device)
    return DraftTree(tokens=tree.tokens, parents=torch.where(pruned, -1, tree.parents),
                     depths=torch.where(pruned, 1, tree.depths), valid=tree.valid & ~pruned,
                     tree_mask=torch.where(pruned[:, None], eye, tree.tree_mask & ~pruned[None, :]),
                     joint_logprobs=tree.joint_logprobs, candidate_ids=tree.candidate_ids)
