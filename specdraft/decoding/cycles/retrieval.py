"""Retrieval cycles (`RetrievalCycle`, SAM-Decoding, Hu et al., arXiv:2411.10666): a cycle that verifies tokens
retrieved from a suffix automaton of the text (policies/sam.py chooses when, policies/suffix_automaton.py finds
them), loaded into a static buffer before the cycle.

- Select (SAM-Decoding's combination with EAGLE): the cycle verifies the retrieved chain alone: no draft model
  call, k + 1 verify rows (root and k tokens), from layer 0.
- Merge: the cycle verifies the model's tree and the retrieved chain in one pass. The chain is grafted onto the
  tree as a trie (`graft_chain`): where the tree already holds its first L tokens as a path from the root, the
  rest hangs under that path's last node (so no node has two children of one token, which both the greedy walk
  and the sampled walk need); budget + k rows.

Each is one CUDA graph (the retrieved tokens enter through a static buffer, copied in before the graph replays):
a continuation shorter than `draft_len` is repeated to that length (past the end of a repeating text, a repeat is
the likeliest guess; a wrong one costs a verify row), so every retrieval cycle has one shape. The retrieved
tokens are point-mass drafts decided by the text alone, so the acceptance rule keeps the target's output (greedy)
or distribution (sampling).
"""
from __future__ import annotations

from functools import partial
from typing import List

import torch

from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind, CycleRun
from specdraft.decoding.cycles.context import CycleContext
from specdraft.decoding.sampled_drafts import SampledDrafts
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.tree import DraftTree


class RetrievalCycle(CycleKind):
    """A cycle of `draft_len` retrieved tokens, alone or grafted onto the model's tree of `shape` (`merge`)."""

    def __init__(self, context: CycleContext, shape: TreeShape, draft_len: int, merge: bool = False):
        self.context, self.shape, self.draft_len, self.merge = context, shape, draft_len, merge
        self.most_tokens = max(shape.depth, draft_len) + 1 if merge else draft_len + 1
        device = context.device
        self.drafted = torch.zeros(draft_len, dtype=torch.long, device=device)  # [K] the retrieved tokens
        self.staging = torch.zeros(draft_len, dtype=torch.long, pin_memory=device.type == "cuda")
        index = torch.arange(draft_len + 1, device=device)
        self.index, self.causal = index, index[:, None] >= index[None, :]  # [K+1], [K+1, K+1]
        self.all_valid = torch.ones(draft_len + 1, dtype=torch.bool, device=device)
        self.no_scores = torch.zeros(draft_len + 1, device=device)

    def load(self, tokens: List[int]) -> None:
        """The retrieved tokens, repeated to `draft_len`, into the static buffer the graphs read (the previous
        copy is done: the engine read the previous cycle, queued after it)."""
        count = self.draft_len
        self.staging.copy_(torch.tensor((tokens * -(-count // len(tokens)))[:count], dtype=torch.long))
        self.drafted.copy_(self.staging, non_blocking=True)

    def run(self, acceptance: Acceptance, generator) -> CycleRun:
        context, count = self.context, self.draft_len
        if self.merge:
            nodes = self.shape.budget + count
            inputs = context.tree_inputs(acceptance, nodes, self.shape, generator)
            out = context.graphed(context.scored_key(f"retrieval-merged:{acceptance.key}"),
                                  partial(self._merged, acceptance), *inputs)
            return CycleRun(out, context.drafted_count(nodes))
        randomness = acceptance.randomness(count + 1, generator, context.device)
        args = () if randomness is None else (randomness,)
        out = context.graphed(context.scored_key(f"retrieval:{acceptance.key}"), partial(self._retrieved, acceptance),
                              *args)
        return CycleRun(out, count)

    # ---- graph bodies ---------------------------------------------------------------------------------------
    def _retrieved(self, acceptance: Acceptance, randomness=None):
        """The root and the retrieved tokens as a chain, verified from layer 0, accepted, committed."""
        context, count = self.context, self.draft_len
        nodes = count + 1
        tokens = torch.cat([context.root, self.drafted])  # [n]
        tree = DraftTree(tokens=tokens, parents=self.index[:nodes] - 1, depths=self.index[:nodes],
                         valid=self.all_valid[:nodes], tree_mask=self.causal[:nodes, :nodes],
                         joint_logprobs=self.no_scores[:nodes])
        return context.accept_and_commit(acceptance, tree, context.verify(tree, start_layer=0), count, randomness)

    def _merged(self, acceptance: Acceptance, randomness=None, noise=None):
        """The model's tree with the retrieved tokens grafted on, verified in one pass."""
        context = self.context
        tree = graft_chain(context.build_tree(self.shape, context.draws(acceptance, noise)), self.drafted)
        return context.accept_and_commit(acceptance, tree, context.verify(tree), max(self.shape.depth, self.draft_len),
                                         randomness)


def _on_chain_path(tree: DraftTree, chain: torch.Tensor) -> torch.Tensor:
    """-> [N] bool: the node and each of its ancestors hold the chain's token of their depth (the root always)."""
    along = torch.cat([tree.tokens[:1], chain])  # [K+1] the path's token at each depth
    at_depth = along[tree.depths.clamp(max=chain.shape[0])]  # [N]
    off = (tree.tokens != at_depth) | ~tree.valid | (tree.depths > chain.shape[0])  # [N]
    return (tree.tree_mask.float() @ off.float()[:, None])[:, 0] == 0  # [N] no ancestor off the path


def graft_chain(tree: DraftTree, chain: torch.Tensor) -> DraftTree:
    """tree (N nodes), chain [K] (the tokens after the root) -> the tree with the chain's nodes appended (N + K
    nodes): chain node j (depth j) hangs under the tree's deepest node on the chain's path when j is one past it,
    else under chain node j - 1; the chain nodes the tree already holds become padding (under no node)."""
    nodes, count, device = tree.tokens.shape[0], chain.shape[0], chain.device
    path_depths = torch.where(_on_chain_path(tree, chain), tree.depths, -1)  # [N]
    reached, graft = path_depths.max(dim=0, keepdim=True)  # [1] depth the tree holds, [1] its node there
    depth = torch.arange(1, count + 1, device=device)  # [K]
    kept = depth > reached  # [K]
    own = nodes + torch.arange(count, device=device)  # [K] the chain nodes' indices
    parents = torch.where(kept, torch.where(depth == reached + 1, graft, own - 1), -1)  # [K]
    eye = torch.eye(count, dtype=torch.bool, device=device)
    sees_chain = (kept[None, :] & (depth[None, :] <= depth[:, None])) | eye  # [K, K]
    sees_tree = tree.tree_mask.index_select(0, graft).expand(count, nodes) & kept[:, None]  # [K, N]
    top = torch.cat([tree.tree_mask, torch.zeros(nodes, count, dtype=torch.bool, device=device)], dim=1)
    mask = torch.cat([top, torch.cat([sees_tree, sees_chain], dim=1)], dim=0)  # [N + K, N + K]
    sampled = None
    if tree.sampled is not None:
        none = torch.full((count,), -1, dtype=torch.long, device=device)
        sampled = SampledDrafts(rows=torch.cat([tree.sampled.rows, none]), logprobs=tree.sampled.logprobs,
                                d2t=tree.sampled.d2t, sampled=torch.cat([tree.sampled.sampled, none > 0]))
    return DraftTree(tokens=torch.cat([tree.tokens, chain]), parents=torch.cat([tree.parents, parents]),
                     depths=torch.cat([tree.depths, torch.where(kept, depth, 1)]), valid=torch.cat([tree.valid, kept]),
                     tree_mask=mask, joint_logprobs=torch.cat([tree.joint_logprobs, torch.zeros(count, device=device)]),
                     sampled=sampled)
