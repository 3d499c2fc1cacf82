"""The EAGLE-2 dynamic draft tree (Li et al., arXiv:2406.16858), with static shapes.

Expansion: depth 1 takes the draft's top-k tokens after the root. At each later depth the k frontier nodes
with the highest joint probability (the product of the draft probabilities along their path) each propose
their top-k children; of those k*k children the k best by joint probability become the next frontier. After
`depth` levels every proposed token is a candidate; the `budget - 1` candidates with the highest joint
probability (plus the root) form the tree that the target verifies. A child's joint probability never exceeds
its parent's, so the kept set is closed under ancestors (ties are repaired explicitly). A budget of every candidate
(`shape.num_candidates`) verifies the whole expansion, no rerank (how C2T's traces see what the target accepts).

A chain of k drafts is the same procedure with top-1 at each depth and budget k + 1.

A tree scorer (C2T) prunes where `prune_at` says: "selection" (the runtime's default): the expansion and the
`budget` best by joint probability stay EAGLE-2's, and the scorer then drops the selected nodes under β (and their
descendants); "expansion" (the paper's): a child scored under β is dropped as the depth is expanded (-inf: never a
frontier node, never selected), so the frontier and the budget go to the kept candidates. Either way the dropped
nodes become padding. A pruned tree may be verified at a size below its budget (`verify_sizes`, cycles/sized_verify.py):
`kept_first` moves its real nodes ahead of the padding, and `tree_rows` cuts it to a size.

Candidate states (`keep_states`, for a drafter whose verify may start above the target's shallow layers): after
`first` and after each `step`, the drafter runs the depth's new candidates (all of them, not just the frontier:
any may be selected) through its shallow layers with its own `tree_candidates` hook, each attending to its
root-to-node path; the tree then records which candidate each node is (`candidate_ids`), so that the verify
can start from those states (cycles/context.py, `tree_verify_states`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple, Optional, Sequence, Tuple

import torch

from specdraft.core.drafting import Drafter, TreeScorer
from specdraft.core.errors import SpecdraftError
from specdraft.kernels.draft_topk import draft_topk
from specdraft.kernels.sampled_topk import sampled_topk
from specdraft.kernels.tree_frontier import advance_frontier
from specdraft.kernels.tree_select import TreeSelection, ancestry, select_tree
from specdraft.decoding.sampled_drafts import DraftDraws, SampledDrafts
from specdraft.decoding.shapes import TreeShape


VERIFY_STEP = 8
"""A pruned tree's verify sizes are the multiples of this up to its budget, and the budget (`verify_sizes`): at most
7 padding rows a cycle, and a CUDA graph per size (5 at budget 40). A verify's time is about flat in its rows at
such sizes (docs/benchmarks.md, verify-cost suite), so finer sizes would save little and capture more graphs;
coarser ones would verify up to 15 padding rows."""


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [N] target ids; node 0 is the root
    parents: torch.Tensor  # [N] parent node index, -1 for the root and for padding
    depths: torch.Tensor  # [N] 0 for the root
    valid: torch.Tensor  # [N] bool: False for padding (when ties removed candidates)
    tree_mask: torch.Tensor  # [N, N] bool: node i sees node j (j is i or an ancestor)
    joint_logprobs: torch.Tensor  # [N] draft log-probability of the path to each node (0 for the root)
    candidate_ids: Optional[torch.Tensor] = None  # [N] ascending: each node's index among the candidates
    sampled: Optional[SampledDrafts] = None  # at T > 0 with sampled drafts: what the verify reads of them


class _TreeConstants(NamedTuple):
    """What a tree's expansion reads that depends on its shape alone, built once per shape and device (each a
    launch or two a cycle otherwise)."""
    root_score: torch.Tensor  # [1] float32 0: the root's joint log-probability
    root_id: torch.Tensor  # [1] int64 0: the root's candidate index
    root_parent: torch.Tensor  # [1] int64 -1
    first_parents: torch.Tensor  # [k] int64 0: depth 1 hangs under the root
    first_ids: torch.Tensor  # [k] int64 1..k: depth 1's candidate indices
    first_visible: torch.Tensor  # [k, W] bool: depth 1's node j sees scratch slot 0 (the root) and its own, 1 + j
    slots_by_depth: torch.Tensor  # [D-1, k] int64: depth d's scratch slots (row d - 1)
    depth_offsets: torch.Tensor  # [D-1] int64 1..D-1: depth d's position past the root's
    first_child: torch.Tensor  # [C] bool: the candidate is its parent's first child (sampled at T > 0)
    expanded_rows: torch.Tensor  # [R] int64 0..R-1: the expanded nodes' rows of log q, in expansion order


@functools.cache  # never evicted: the CUDA graphs of a shape read these at their capture's addresses
def _tree_constants(shape: TreeShape, device: torch.device) -> _TreeConstants:
    k, long = shape.topk, dict(dtype=torch.long, device=device)
    slots_by_depth = 1 + torch.arange((shape.depth - 1) * k, **long).view(-1, k)
    columns, first_ids = torch.arange(shape.scratch, **long), torch.arange(1, 1 + k, **long)  # [W], [k]
    candidates = torch.arange(shape.num_candidates, **long)  # depth 1 is 1..k, then blocks of k per parent
    first_child = (candidates == 1) | ((candidates > k) & ((candidates - 1 - k) % k == 0))
    return _TreeConstants(
        root_score=torch.zeros(1, device=device), root_id=torch.zeros(1, **long),
        root_parent=torch.full((1,), -1, **long),
        first_parents=torch.zeros(k, **long), first_ids=first_ids,
        first_visible=(columns == 0) | (columns == first_ids[:, None]),  # depth 1's scratch slots are 1..k too
        slots_by_depth=slots_by_depth,
        depth_offsets=torch.arange(1, shape.depth, **long), first_child=first_child,
        expanded_rows=torch.arange(shape.expanded_rows, **long))


def _paths_of_children(parent_paths: torch.Tensor, first: int, per_parent: int) -> torch.Tensor:
    """parent_paths [p, C] bool (the candidates from the root to each parent) -> [p * per_parent, C], the paths
    of their children, numbered first, first + 1, ... (per_parent consecutive ones per parent): the parent's path
    and the child itself."""
    paths = parent_paths.repeat_interleave(per_parent, dim=0)  # [c, C]
    own = first + torch.arange(paths.shape[0], device=paths.device)  # [c]
    return paths | (torch.arange(paths.shape[1], device=paths.device)[None, :] == own[:, None])


class TreeExpansion:
    """The expansion's state from depth to depth. `first` drafts depth 1 under the root; `advance(d)` expands depth
    d's frontier into depth d + 1's candidates; `candidates(d)` are those of depths 0..d. The one-graph cycle runs
    them back to back (`build_tree`); a cycle that may stop early runs each in its own CUDA graph
    (depth_stop.py), so each keeps what the next reads in attributes (a graph's outputs keep their addresses).
    With a scorer, the children it drops score -inf; with keep_states, every candidate also goes through the
    drafter's `tree_candidates` (module docstring); with draws (T > 0), each expanded node's first child is
    sampled (sampled_drafts.py)."""

    def __init__(self, drafter: Drafter, shape: TreeShape, root: torch.Tensor, root_position: torch.Tensor,
                 keep_states: bool = False, scorer: Optional[TreeScorer] = None, draws: Optional[DraftDraws] = None,
                 prune_at: str = "selection", d2t: Optional[torch.Tensor] = None):
        self.drafter, self.shape, self.root, self.root_position = drafter, shape, root, root_position
        self.keep_states, self.scorer, self.draws, self.prune_at = keep_states, scorer, draws, prune_at
        self.d2t = drafter.d2t if d2t is None else d2t  # [Vd] draft index -> target id offset (vocabulary.py)
        self.const = _tree_constants(shape, root.device)
        pieces = shape.depth + 1  # piece d: depth d's candidates (piece 0 the root)
        self.kept = [None] * pieces  # with prune_at "selection": piece d's candidates the scorer keeps, [n] bool
        self.tokens, self.parents, self.scores = [None] * pieces, [None] * pieces, [None] * pieces
        self.expanded = [None] * pieces  # piece d: depth d's frontier
        self.draft_logprobs = None if draws is None else torch.empty(  # [R, Vd] log q of each expanded node, rows
            shape.expanded_rows, self.d2t.shape[0], device=draws.exponential.device)  # in expansion order
        self.frontiers = [None] * pieces  # depth d's frontier (each depth's own: a graph reads the one before)
        self.positions = None
        self.logits = None  # [k, Vd] the draft logits of the newest depth (a stop rule reads them)

    def _children(self, logits: torch.Tensor, row: int) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """logits [r, Vd] of r expanded nodes (rows row.. of the draws) -> (scores [r, k], target ids [r, k],
        log q [r, Vd] or None)."""
        k = self.shape.topk
        if self.draws is None:
            return (*draft_topk(logits, self.d2t, k), None)
        rows = slice(row, row + logits.shape[0])  # into one buffer the verify reads whole (no concatenation)
        return sampled_topk(logits, self.d2t, k, self.draws.exponential[rows], self.draws.temperature,
                            self.draft_logprobs[rows])

    def _scored(self, child_logprobs: torch.Tensor, parent_scores: torch.Tensor, draft_logits: torch.Tensor,
                depth: int) -> torch.Tensor:
        """child_logprobs [p, k] of p parents' top-k children at `depth` -> the scores the expansion goes on with:
        with prune_at "expansion", the children the scorer drops at -inf (their joint log-probabilities, and every
        descendant's, become -inf: never expanded, and padding if the selection takes them); with "selection",
        unchanged, the scorer's choice kept aside for `select` (self.kept[depth])."""
        if self.scorer is None:
            return child_logprobs
        pruned = self.scorer.prune(child_logprobs, parent_scores, draft_logits, depth)
        if self.prune_at == "expansion":
            return pruned
        self.kept[depth] = (pruned > float("-inf")).flatten()  # [p * k], the candidates' order
        return child_logprobs

    def first(self) -> None:
        k, const, drafter = self.shape.topk, self.const, self.drafter
        logits, hidden = drafter.first(self.root, self.root_position)  # [1, Vd], [1, Hd]
        scores, tokens, _ = self._children(logits, 0)  # [1, k]
        scores = self._scored(scores, const.root_score, logits, 1)
        self.tokens[:2], self.parents[:2] = [self.root, tokens[0]], [const.root_parent, const.first_parents]
        self.scores[:2], self.expanded[0] = [const.root_score, scores[0]], const.root_id
        frontier = _Frontier(tokens[0], scores[0], const.first_ids, hidden.expand(k, -1),  # [k, Hd]
                             const.first_visible, None)
        self.positions = self.root_position + const.depth_offsets  # [D-1] depth d's position is row d - 1
        self.logits = logits
        if self.keep_states:
            root_path = torch.arange(self.shape.num_candidates, device=self.root.device)[None, :] == 0  # [1, C]
            paths = _paths_of_children(root_path, 1, k)  # [k, C] depth 1: every candidate is expanded
            lane = torch.arange(k, device=self.root.device)  # depth 1's frontier: all k candidates
            drafter.tree_candidates(tokens[0], (self.root_position + 1).expand(k), 1, paths, lane)
            frontier = frontier._replace(paths=paths)
        self.frontiers[1] = frontier

    def advance(self, depth: int) -> None:
        """Depth `depth`'s frontier (1-based) -> depth + 1's candidates and frontier."""
        k, shape, old = self.shape.topk, self.shape, self.frontiers[depth]
        slots = self.const.slots_by_depth[depth - 1]  # [k]
        positions = self.positions[depth - 1:depth].expand(k)  # [k]
        logits, hidden = self.drafter.step(depth, old.hidden, old.tokens, positions, slots, old.visible)  # [k, Vd]
        child_scores, child_tokens, _ = self._children(logits, 1 + (depth - 1) * k)  # [k, k] each
        child_scores = self._scored(child_scores, old.scores, logits, depth + 1)
        base = 1 + k + (depth - 1) * k * k  # the candidate index of this depth's first child
        next_slots = 1 + depth * k if depth + 1 < shape.depth else None  # the next frontier's scratch slots
        frontier = advance_frontier(child_scores, child_tokens, old.scores, old.ids, base, hidden, old.visible,
                                    next_slots)
        self.tokens[depth + 1], self.scores[depth + 1] = child_tokens.flatten(), frontier.joint  # [k * k]
        self.parents[depth + 1], self.expanded[depth] = frontier.parents, old.ids
        paths = None
        if self.keep_states:
            child_paths = _paths_of_children(old.paths, base, k)  # [k * k, C]
            self.drafter.tree_candidates(child_tokens.flatten(), (self.root_position + depth + 1).expand(k * k),
                                         base, child_paths, frontier.best)
            paths = child_paths[frontier.best]
        self.frontiers[depth + 1] = _Frontier(frontier.tokens, frontier.scores, frontier.ids, frontier.hidden,
                                              frontier.visible, paths)
        self.logits = logits

    def candidates(self, depth: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Depths 0..depth's candidates -> (tokens [C], parents [C] (candidate indices), joint scores [C])."""
        pieces = slice(0, depth + 1)
        return torch.cat(self.tokens[pieces]), torch.cat(self.parents[pieces]), torch.cat(self.scores[pieces])

    def sampled_drafts(self, chosen: torch.Tensor, depth: int) -> Optional[SampledDrafts]:
        """chosen [N] (the selection's candidate indices) -> what the verify of sampled drafts reads, or None."""
        if self.draws is None:
            return None
        expanded = torch.cat(self.expanded[:depth])  # [R] the candidates expanded before depth `depth`
        row_of = torch.full((self.const.first_child.shape[0],), -1, dtype=torch.long, device=chosen.device)
        row_of[expanded] = self.const.expanded_rows[:expanded.shape[0]]
        return SampledDrafts(rows=row_of[chosen], logprobs=self.draft_logprobs[:expanded.shape[0]],
                             d2t=self.d2t, sampled=self.const.first_child[chosen])

    def select(self, depth: int) -> DraftTree:
        """The tree of depths 0..depth's candidates the target verifies (at most `budget` nodes, static shapes)."""
        cand_tokens, cand_parents, cand_scores = self.candidates(depth)
        budget = min(self.shape.budget, cand_tokens.shape[0])
        select = _every_candidate if budget == cand_tokens.shape[0] else select_tree
        selection = select(cand_tokens, cand_parents, cand_scores, budget, depth)
        if self.scorer is not None and self.prune_at == "selection":
            kept = torch.cat([torch.ones_like(self.const.root_id, dtype=torch.bool), *self.kept[1:depth + 1]])  # [C]
            selection = _drop_unkept(selection, kept[selection.chosen])
        return DraftTree(tokens=selection.tokens, parents=selection.parents, depths=selection.depths,
                         valid=selection.valid, tree_mask=selection.tree_mask,
                         joint_logprobs=selection.joint_logprobs, candidate_ids=selection.chosen,
                         sampled=self.sampled_drafts(selection.chosen, depth))


class _Frontier(NamedTuple):
    tokens: torch.Tensor  # [k]
    scores: torch.Tensor  # [k] joint log-probabilities
    ids: torch.Tensor  # [k] candidate indices
    hidden: torch.Tensor  # [k, Hd] each node's parent's draft output
    visible: torch.Tensor  # [k, W] the scratch slots each sees (its ancestors and itself)
    paths: Optional[torch.Tensor]  # [k, C] with keep_states: the candidates from the root to each


def build_tree(drafter: Drafter, shape: TreeShape, root: torch.Tensor, root_position: torch.Tensor,
               keep_states: bool = False, scorer: Optional[TreeScorer] = None,
               draws: Optional[DraftDraws] = None, prune_at: str = "selection",
               d2t: Optional[torch.Tensor] = None) -> DraftTree:
    """root [1] token, root_position [1] -> the tree the target verifies (budget nodes, static shapes);
    keep_states: the drafter keeps every candidate's shallow state (module docstring); scorer: drops candidates
    after each depth's expansion or from the selection (`prune_at`, module docstring), and those selected anyway
    become padding; draws: sampled drafts at T > 0 (sampled_drafts.py); d2t: the draft vocabulary's map to target
    ids (default the drafter's; the engine passes its checked copy, vocabulary.py)."""
    expansion = TreeExpansion(drafter, shape, root, root_position, keep_states, scorer, draws, prune_at, d2t)
    expansion.first()
    for depth in range(1, shape.depth):
        expansion.advance(depth)
    return expansion.select(shape.depth)


def _every_candidate(cand_tokens: torch.Tensor, cand_parents: torch.Tensor, cand_scores: torch.Tensor, budget: int,
                     max_depth: int) -> TreeSelection:
    """`select_tree` where the budget keeps every candidate: node i is candidate i (no sort, and no selection
    kernel, which is sized for the budgets trees are verified at); a candidate a scorer dropped (-inf) is padding."""
    reach = ancestry(cand_parents, max_depth)  # [C, C]
    valid = reach[:, 0] & (cand_scores > float("-inf"))
    eye = torch.eye(budget, dtype=torch.bool, device=reach.device)
    return TreeSelection(tokens=cand_tokens, parents=torch.where(valid, cand_parents, -1),
                         depths=torch.where(valid, reach.sum(1) - 1, 1), valid=valid,
                         tree_mask=reach & valid[:, None] | eye,
                         joint_logprobs=torch.where(valid, cand_scores, float("-inf")),
                         chosen=torch.arange(budget, device=reach.device))



def _drop_unkept(selection: TreeSelection, keep: torch.Tensor) -> TreeSelection:
    """keep [N] bool, the scorer's choice per selected node -> the selection with every node that is not kept, or
    has an ancestor that is not, as padding (parent -1, depth 1, sees itself alone, -inf)."""
    lost = (selection.tree_mask > keep[None, :]).any(1)  # an ancestor (or itself) not kept; bool: True > False
    valid = selection.valid > lost
    eye = torch.eye(valid.shape[0], dtype=torch.bool, device=valid.device)
    return selection._replace(parents=torch.where(valid, selection.parents, -1),
                              depths=torch.where(valid, selection.depths, 1), valid=valid,
                              tree_mask=torch.where(valid[:, None], selection.tree_mask, eye),
                              joint_logprobs=torch.where(valid, selection.joint_logprobs, float("-inf")))


def verify_sizes(budget: int, step: int = VERIFY_STEP) -> Tuple[int, ...]:
    """The sizes a pruned tree of `budget` nodes is verified at: the multiples of `step` below it, then it."""
    return (*range(step, budget, step), budget)


def verify_size(kept: int, sizes: Tuple[int, ...]) -> int:
    """The smallest of `sizes` (ascending) that holds `kept` real nodes (the largest when none does)."""
    return next((size for size in sizes if size >= kept), sizes[-1])


def kept_first(tree: DraftTree) -> DraftTree:
    """The same tree with its real nodes first (in their order: a parent still comes before its children) and the
    padding after them, so that its first n rows hold every real node for any n >= their count (`tree_rows`)."""
    order = torch.sort((~tree.valid).to(torch.uint8), stable=True).indices  # [N] new node i is old node order[i]
    new_of = torch.empty_like(order).scatter_(0, order, torch.arange(order.shape[0], device=order.device))
    parents = tree.parents[order]  # [N] old indices, -1 for the root and padding
    sampled = tree.sampled
    if sampled is not None:
        sampled = replace(sampled, rows=sampled.rows[order], sampled=sampled.sampled[order])
    return DraftTree(tokens=tree.tokens[order], parents=torch.where(parents >= 0, new_of[parents.clamp(min=0)], -1),
                     depths=tree.depths[order], valid=tree.valid[order],
                     tree_mask=tree.tree_mask[order][:, order], joint_logprobs=tree.joint_logprobs[order],
                     candidate_ids=None if tree.candidate_ids is None else tree.candidate_ids[order], sampled=sampled)


def tree_rows(tree: DraftTree, rows: int) -> DraftTree:
    """The first `rows` nodes of a `kept_first` tree (its real nodes, then padding up to `rows`)."""
    sampled = tree.sampled
    if sampled is not None:
        sampled = replace(sampled, rows=sampled.rows[:rows], sampled=sampled.sampled[:rows])
    return DraftTree(tokens=tree.tokens[:rows], parents=tree.parents[:rows], depths=tree.depths[:rows],
                     valid=tree.valid[:rows], tree_mask=tree.tree_mask[:rows, :rows].contiguous(),
                     joint_logprobs=tree.joint_logprobs[:rows],
                     candidate_ids=None if tree.candidate_ids is None else tree.candidate_ids[:rows], sampled=sampled)


def shallow_tree_start(drafter: Optional[Drafter], capture: Sequence[int], shape: TreeShape, chain: bool,
                       reuse: bool) -> int:
    """The layer a tree's verify starts at: the drafter's verify_start_layer when `reuse` asks for it (the drafter
    is then told to keep one state per candidate), else 0. Asked on a chain, or of a drafter without the tree
    hooks (one that runs no shallow layer of the target), it is an error."""
    if not reuse:
        return 0
    if chain:
        raise SpecdraftError("--shallow-reuse-tree applies to trees: drop --chain (or --topk 1)")
    if not drafter.caps.shallow_tree:
        raise SpecdraftError("--shallow-reuse-tree needs a draft that runs the target's shallow layers "
                             "(Kangaroo); this one does not")
    start = drafter.verify_start_layer
    if min(capture, default=start) < start:
        raise SpecdraftError(f"the drafter's verify_start_layer {start} is above the feature layers "
                             f"{list(capture)} it reads; the verify could not capture them")
    drafter.keep_tree_states(shape.num_candidates)
    return start
