"""The block drafter's cycle (`BlockCycle`): one drafter pass proposes the B - 1 positions after the root at once
(`Drafter.propose`, a drafter declaring `DrafterCaps.block_size` B: DFlash, P-EAGLE), and the cycle verifies what
it builds of those proposals, accepts and commits, the whole cycle one CUDA graph as the fixed tree's.

Row d - 1 of the proposals is the draft's distribution of the token at depth d (position n + d), read from the root
and the confirmed prefix alone. So the drafted tree is the EAGLE-2 expansion (decoding/tree.py) of a drafter whose
every node at depth d proposes row d - 1, whatever its parent (`BlockRows`); the shape (runtime.depth, topk, budget)
fixes it, static:

- topk 1 (a chain, the block drafter's default with depth B - 1): the proposals' argmax chain, root + depth nodes;
- topk k > 1 (a block tree): depth 1 holds row 0's top k under the root; at each later depth the k frontier nodes of
  the highest joint probability (the product of their path's proposal probabilities) each take the next row's top k
  as children, the k best of those k * k become the next frontier, and the `budget` best candidates by joint
  probability form the verified tree. Siblings share their children's tokens (the rows read no drafted token), but
  not their paths: a first choice the target rejects at depth d leaves its sibling's subtree to go on.

The depth is at most B - 1 (the rows there are). Acceptance is the engine's rule (accept.py): at T = 0 the deepest
path of the target's argmax, at T > 0 recursive rejection sampling, each expanded node's first child sampled from
its row at the temperature and tested against it (sampled_drafts.py): lossless whatever the proposals hold, since a
node's proposal need not depend on its path. Ids go through `kernels.draft_topk` / `sampled_topk` and the checked
`context.d2t`, so a broken proposal (NaN, inf, garbage ids) costs acceptance only, as in the other kinds.
"""
from __future__ import annotations

import torch

from specdraft.core.drafting import Drafter
from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.context import CycleContext
from specdraft.decoding.cycles.tree import TreeCycle
from specdraft.decoding.outputs import CycleOutput
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.tree import build_tree


class BlockRows(Drafter):
    """A block's proposals as the tree expansion reads a drafter: the frontier of depth d (any of its k nodes) draws
    the children of depth d + 1 from row d; no state, no cache (the block drafter wrote its own in `propose`)."""

    def __init__(self, rows: torch.Tensor, d2t: torch.Tensor):
        self.rows, self.d2t = rows, d2t  # [B - 1, Vd], [Vd]
        self.feature_layers = []
        self.no_hidden = rows.new_zeros(1, 1)  # [1, 1]: the expansion carries a hidden state it never reads here

    def first(self, root_token: torch.Tensor, position: torch.Tensor):
        return self.rows[:1], self.no_hidden  # [1, Vd], [1, 1]

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        k = tokens.shape[0]  # the frontier at `depth` -> the row of depth + 1, once per node (stride 0)
        return self.rows[depth:depth + 1].expand(k, -1), hidden  # [k, Vd], [k, 1]


class BlockCycle(TreeCycle):
    """The cycle of a block drafter under `shape` (module docstring)."""

    def __init__(self, context: CycleContext, shape: TreeShape):
        proposals = context.drafter.caps.block_size - 1
        if proposals < 1:
            raise SpecdraftError(f"a block cycle needs a drafter declaring block_size >= 2; this one declares "
                                 f"{context.drafter.caps.block_size}")
        if shape.depth > proposals:
            raise SpecdraftError(f"tree depth {shape.depth} is deeper than the block drafter's {proposals} proposals "
                                 f"(block_size {proposals + 1}): use runtime.depth <= {proposals}")
        if context.stage is not None or context.tree_start_layer:
            raise SpecdraftError("a block drafter's tree is verified from layer 0 and not narrowed: drop "
                                 "runtime.intermediate and --shallow-reuse-tree")
        super().__init__(context, shape)

    def key(self, acceptance: Acceptance) -> str:
        shape = self.shape
        return self.context.scored_key(f"block:{acceptance.key}:{shape.depth},{shape.topk},{shape.budget}")

    def draft(self, draws=None):
        """The cycle's drafting: one propose, the tree of its proposals under the shape (draws None: point
        masses) -> the DraftTree the verify reads (also the profiler's draft phase, engine.build_tree)."""
        context = self.context
        rows = context.drafter.propose(context.root, context.prefix_len)  # [B - 1, Vd]
        return build_tree(BlockRows(rows, context.d2t), self.shape, context.root, context.prefix_len, False,
                          context.scorer, draws, context.prune_at, context.d2t)

    def body(self, acceptance: Acceptance, randomness=None, noise=None) -> CycleOutput:
        """The graph's body: propose, build the tree of the proposals, verify, accept, commit."""
        context = self.context
        tree = self.draft(context.draws(acceptance, noise))
        return context.accept_and_commit(acceptance, tree, context.verify(tree), self.shape.depth, randomness)
