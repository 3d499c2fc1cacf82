"""Retrieval drafts in the engine's cycles (SAM-Decoding, Hu et al., arXiv:2411.10666): before each cycle the host
asks the suffix automaton (retrieval.py) for the tokens that followed the longest earlier occurrence of the text's
newest suffix; when that match is at least `min_match` tokens long, the cycle verifies them.

- Select (SAM-Decoding's combination with EAGLE): the cycle verifies the retrieved chain alone: no draft model
  call, k + 1 verify rows (root and k tokens). Otherwise the engine's own tree (or chain) cycle.
- Merge: the cycle verifies the model's tree and the retrieved chain in one pass. The chain is grafted onto the
  tree as a trie: where the tree already holds its first L tokens as a path from the root, the rest hangs under
  that path's last node (so no node has two children of one token, which both the greedy walk and the sampled
  walk need); budget + k rows.

Each is one CUDA graph (the retrieved tokens enter through a static buffer, copied in before the graph replays),
chosen on the host per cycle, as chain.py chooses per depth: a continuation shorter than `draft_len` is repeated
to that length (past the end of a repeating text, a repeat is the likeliest guess; a wrong one costs a verify row),
so every retrieval cycle has one shape. The automaton runs on the host between cycles, so the engine reads every
cycle before queuing the next. The retrieved tokens are point-mass
drafts decided by the text alone, so the acceptance rule keeps the target's output (greedy) or distribution
(sampling).
"""
from __future__ import annotations

from functools import partial
from typing import Dict, List, Sequence

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.drafting_policy import DraftingPolicy
from specdraft.decoding.retrieval import Retrieval
from specdraft.decoding.sampled_drafts import SampledDrafts
from specdraft.decoding.tree import DraftTree


class RetrievalDrafts(DraftingPolicy):
    """The engine's cycles with retrieval drafts when the match is long enough (module docstring)."""

    def __init__(self, retrieval: Retrieval, merge: bool = False):
        self.retrieval, self.merge = retrieval, merge
        self.counts: Dict[str, int] = {"retrieval": 0, "model": 0}  # cycles of each kind, since construction

    def attach(self, engine) -> None:
        super().attach(engine)
        if self.merge and engine.chain is not None:
            raise SpecdraftError("sam_merge grafts the retrieval draft onto a tree; a chain verifies it alone "
                                 "(set sam_merge false, or draft a tree)")
        if self.merge and engine.tree_start_layer:
            raise SpecdraftError("sam_merge verifies from layer 0: drop --shallow-reuse-tree")
        count, device = self.retrieval.draft_len, engine.device
        self.drafted = torch.zeros(count, dtype=torch.long, device=device)  # [K] the retrieved tokens
        self.staging = torch.zeros(count, dtype=torch.long, pin_memory=device.type == "cuda")
        index = torch.arange(count + 1, device=device)
        self.index, self.causal = index, index[:, None] >= index[None, :]  # [K+1], [K+1, K+1]
        self.all_valid, self.no_scores = torch.ones(count + 1, dtype=torch.bool, device=device), \
            torch.zeros(count + 1, device=device)

    def max_depth(self) -> int:
        return max(self.engine.shape.depth, self.retrieval.draft_len)

    def extra_rows(self) -> int:
        return self.retrieval.draft_len

    def stats(self) -> Dict[str, int]:
        return {f"{kind}_cycles": count for kind, count in self.counts.items()}

    def begin(self, tokens: Sequence[int]) -> None:
        self.retrieval.reset(tokens)

    def observe(self, new_tokens: List[int]) -> None:
        self.retrieval.extend(new_tokens)

    def _upload(self, tokens: List[int]) -> None:
        """The retrieved tokens, repeated to `draft_len`, into the static buffer the graphs read (the previous
        copy is done: the engine read the previous cycle, queued after it)."""
        count = self.retrieval.draft_len
        self.staging.copy_(torch.tensor((tokens * -(-count // len(tokens)))[:count], dtype=torch.long))
        self.drafted.copy_(self.staging, non_blocking=True)

    def cycle(self, temperature: float, generator):
        engine = self.engine
        tokens = self.retrieval.draft()
        if not tokens:
            self.counts["model"] += 1
            return engine.base_cycle(temperature, generator)
        self.counts["retrieval"] += 1
        self._upload(tokens)
        policy, count = engine.acceptance(temperature), self.retrieval.draft_len
        if self.merge:
            nodes = engine.shape.budget + count
            args = engine.cycle_args(policy, nodes, generator)
            return engine.graphed(engine.scored_key(f"retrieval-merged:{policy.key}"),
                                  partial(self._merged, policy, count), *args), engine.drafted_count(nodes)
        randomness = policy.randomness(count + 1, generator, engine.device)
        args = () if randomness is None else (randomness,)
        return engine.graphed(engine.scored_key(f"retrieval:{policy.key}"), partial(self._retrieved, policy, count),
                              *args), count

    # ---- graph bodies ---------------------------------------------------------------------------------------
    def _retrieved(self, policy: Acceptance, count: int, randomness=None):
        """The root and `count` retrieved tokens as a chain, verified from layer 0, accepted, committed."""
        engine, nodes = self.engine, count + 1
        tokens = torch.cat([engine.root, self.drafted[:count]])  # [n]
        tree = DraftTree(tokens=tokens, parents=self.index[:nodes] - 1, depths=self.index[:nodes],
                         valid=self.all_valid[:nodes], tree_mask=self.causal[:nodes, :nodes],
                         joint_logprobs=self.no_scores[:nodes])
        return engine.accept_and_commit(policy, tree, engine.verify_forward(tree, reuse=False), randomness, count)

    def _merged(self, policy: Acceptance, count: int, randomness=None, noise=None):
        """The model's tree with the `count` retrieved tokens grafted on, verified in one pass."""
        engine = self.engine
        tree = graft_chain(engine.build_tree(engine.draws(policy, noise)), self.drafted[:count])
        return engine.accept_and_commit(policy, tree, engine.verify_forward(tree), randomness,
                                        max(engine.shape.depth, count))


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
