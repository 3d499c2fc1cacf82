"""What the runtime needs from a method at inference: a `Drafter`, built by the method spec's `runtime` hook
(`spec.runtime(draft, cfg, target_model) -> Drafter`), which declares what it can do in `DrafterCaps`.

The engine owns the target, its static KV cache and the draft tree; a drafter owns its draft's own caches.
Positions are sequence positions: the confirmed tokens are x_0..x_n, where the root x_n is the newest one (the
target has not run on it yet); a node at depth d of the tree (its token is the d-th drafted token) has
position n + d. One draft-verify cycle (batch 1) calls, in order:

  ingest(features, next_tokens, start, count)
      Positions start..start+count-1 were just run through the target: features[i] [M, H] are the target's
      hidden states there (input of decoder layer i, for i in `feature_layers`) and next_tokens [M] the token
      that follows each position (the last valid one is the new root x_n). Rows >= count are padding (static
      shapes for CUDA graphs). After it, the drafter's confirmed prefix is slots 0..n-1 of its caches.
  first(root_token, position) -> (logits [1, Vd], hidden [1, Hd])
      The draft's distribution for depth 1. A drafter that runs on the root token writes its KV at scratch
      slot 0 (cache slot n); one that has it from `ingest` (EAGLE-3) writes nothing there.
  step(depth, hidden, tokens, positions, scratch_slots, scratch_visible) -> (logits [k, Vd], hidden [k, Hd])
      k frontier nodes at `depth` (a Python int, 1-based): `hidden` [k, Hd] is each node's parent's output,
      `tokens` [k] and `positions` [k] the nodes' own, `scratch_slots` [k] int64 where their KV goes in the
      scratch region (cache slot n + scratch_slots), `scratch_visible` [k, W] bool the scratch slots each may
      attend to (its ancestors, scratch slot 0 = the root, and itself); the whole confirmed prefix 0..n-1 is
      visible too. A drafter that wrote nothing at scratch slot 0 must ignore that column.

Before a prompt's prefill the engine calls `begin(context)` with the prompt's extra context (image features,
say: the names `DrafterCaps.context` declares), outside any CUDA graph. The prompt's own rows (start 0) come to
`ingest_prompt`, which is `ingest` unless a drafter maps prompt positions in a way later rows never need (ViSpec's
image spans): a cycle's `ingest` then stays as short as a text drafter's. A drafter whose `DrafterCaps.context`
names `PROMPT_IDS` finds the prompt's token ids [P] there too: one that runs on tokens needs the first, which no row
holds.

Every tensor argument is on the engine's device and every shape is static for a given (k, depth, W), so the
engine can capture `ingest`, `first` and `step` in CUDA graphs: no host syncs, no data-dependent shapes.
Draft vocabulary index i is target token i + d2t[i]. With k = 1 (a chain) `scratch_slots` is [depth] and every
scratch slot 0..depth is visible: all earlier nodes are ancestors.

Declared capabilities (`DrafterCaps`) switch on further hooks, which the base class refuses otherwise:
  shallow_layers = ℓ > 0 (the drafter runs the target's own layers 0..ℓ-1, e.g. Kangaroo):
    chain_verify_states(tokens, positions, computed) -> hidden [n, H]
        The chain's n nodes (root, then the drafts) entering layer `verify_start_layer`. The first `computed`
        (a Python int) went through the shallow layers in `first`/`step`; the drafter runs the rest now, writing
        their shallow KV at target slots prefix + computed...
    set_verify_start_layer(layer): keep the chain's states entering `layer` (<= ℓ) instead.
  shallow_tree (trees verified from ℓ too):
    keep_tree_states(num_candidates); tree_candidates(tokens, positions, first, paths, frontier);
    tree_verify_states(candidate_ids) -> hidden [N, H] (see specdraft.decoding.tree).
  exit_layers (several drafts at several exits, one drafting per cycle): select_exit(index); `variant`.
  scores_tree: `tree_scorer()` -> a TreeScorer, called between a depth's expansion and the tree's selection (in a
    chain, after each drafted token: the first token it drops ends the chain).
  judges: `node_judge()` -> a NodeJudge, whose scores let the acceptance rule accept a token exact verification
    rejects (lossy, opt-in at run time).
  block_size = B > 0 (a block drafter: one pass drafts the B - 1 positions after the root at once, e.g. DFlash):
    propose(root_token, prefix_len) -> draft_logits [B - 1, Vd]
        Row j - 1 is the draft's distribution of the token at position n + j (j = 1..B-1), from the root x_n and
        the confirmed prefix alone: no row reads another row's drafted token, so every row is a proposal whatever
        tokens the cycle picks from the rows before it. The drafter keeps, between cycles, only what `ingest` gave
        it (its context KV of the confirmed positions 0..n-1); `propose` may write its own scratch (its cache slots
        n..n+B-1, which the next `ingest` overwrites) and nothing else. Static shapes, no host sync: the engine
        captures the call inside its cycle's CUDA graph. A block drafter need not implement `first` and `step`:
        its cycles are the engine's `BlockCycle` (decoding/cycles/block.py), chosen from this capability.
An add-on method (a tree classifier, a judge) serves beside its base draft's drafter as an `ExtendedDrafter`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Protocol, Tuple

import torch

from specdraft.core.errors import SpecdraftError

PROMPT_IDS = "prompt_ids"
"""The name under which `Drafter.begin`'s context holds the prompt's token ids [P] (int64, on the device), for a
drafter whose `DrafterCaps.context` names it."""


@dataclass(frozen=True)
class DrafterCaps:
    """What a drafter can do, declared by it; the runtime reads these and never probes the drafter."""

    shallow_layers: int = 0
    """ℓ: the drafter runs the target's own layers 0..ℓ-1 on the drafted tokens, so that a chain's verify may start
    at layer ℓ (`chain_verify_states`); 0: it runs none of the target."""
    shallow_tree: bool = False
    """Trees too can be verified from ℓ (the tree hooks: keep_tree_states, tree_candidates, tree_verify_states)."""
    exit_threshold: float = 0.0
    """The confidence exit η the draft was trained for: the engine's default for chains (0: off)."""
    draft_cost_layers: float = 1.0
    """One draft step's cost in target-layer equivalents (the dynamic exit's cost model)."""
    exit_layers: Tuple[int, ...] = ()
    """Several drafts at these exit layers over one target, one drafting per cycle (`select_exit`)."""
    exit_costs: Tuple[float, ...] = ()
    """Each of those drafts' draft-step cost (as draft_cost_layers)."""
    context: Tuple[str, ...] = ()
    """Names of the extra prompt context `begin` needs besides the token ids (e.g. image features)."""
    scores_tree: bool = False
    """`tree_scorer()` gives a TreeScorer that may drop candidates while the tree is drafted."""
    judges: bool = False
    """`node_judge()` gives a NodeJudge for learned (lossy) acceptance."""
    block_size: int = 0
    """B: one `propose` call covers B positions, the root and the B - 1 drafted after it (a block drafter: DFlash,
    P-EAGLE), and the engine runs its cycles as `BlockCycle`; 0: the drafter drafts depth by depth (`first`,
    `step`)."""


class TreeScorer(Protocol):
    """Decides, after each depth's expansion, which candidates stay in the tree (the rest become padding that
    nothing selects or accepts; the engine may instead apply its choice to the budget's selection, and verifies
    only what stays: runtime.prune_at, prune_verify). It runs inside the captured cycle: static shapes (dropped children score -inf,
    never a shorter tensor), no host sync, and whatever it reads of a child it computes from what `prune` is given
    (so that the features it was trained on and those it scores are one computation)."""

    threshold: float
    """β: candidates scored below it are dropped (the runtime sets it from runtime.prune_threshold). Setting it
    takes effect in CUDA graphs captured before (a scorer keeps it in a device tensor)."""
    chain_threshold: float
    """The scorer's own β for chains, where dropping a drafted token ends the chain there (an early exit); the
    runtime uses it when runtime.prune_threshold is not given."""

    def prune(self, child_logprobs: torch.Tensor, parent_scores: torch.Tensor, parent_logits: torch.Tensor,
              depth: int) -> torch.Tensor:
        """p expanded parents' top-k children at `depth` (a Python int, 1-based): child_logprobs [p, k] float32 (the
        draft's log-probability of each child), parent_scores [p] float32 (each parent's joint log-probability,
        the path's from the root), parent_logits [p, Vd] (the draft logits the children were drawn from) ->
        [p, k] float32: child_logprobs with the dropped children at -inf."""


class NodeJudge(Protocol):
    """Scores drafted tokens from the target's own last-layer states (before the final norm) at their nodes."""

    threshold: float
    """δ: a node whose score exceeds it is accepted even where the target's argmax differs."""

    def scores(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """target_hidden [N, H] -> [N] float32 scores in [0, 1]."""


class IntermediateModel(Protocol):
    """A small model between the drafter and the target (hierarchical drafting, decoding/hierarchy.py): it scores a
    drafted tree's nodes with its own next-token logits, from which the engine keeps one sequence for the target
    to verify. It keeps its own state of the confirmed prefix (a KV cache), as a drafter does; every call is
    capturable in a CUDA graph (static shapes, no host sync)."""

    feature_layers: List[int]
    """Target hidden-state indices it reads at `prefill` and `commit` (as a drafter's `ingest`; may be empty)."""

    def allocate(self, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        """Static caches for `max_len` slots (the target's)."""

    def state_tensors(self) -> List[torch.Tensor]:
        """Tensors a captured cycle mutates (saved and restored around a CUDA graph's warm-up runs)."""

    def prefill(self, prompt_ids: torch.Tensor, count: torch.Tensor, features: Dict[int, torch.Tensor]) -> None:
        """prompt_ids [R] (the prompt's count [1] tokens, then padding) and the target's features {i: [R, H]} of
        them: fills its prefix from slot 0."""

    def logits(self, tokens: torch.Tensor, positions: torch.Tensor, prefix_len: torch.Tensor,
               tree_mask: torch.Tensor) -> torch.Tensor:
        """A tree's nodes tokens [N] at positions [N] after the confirmed prefix_len [1] slots (node 0 the root,
        tree_mask [N, N]: node i sees node j) -> its logits [N, V] over the target's vocabulary."""

    def commit(self, features: Dict[int, torch.Tensor], tree_nodes: torch.Tensor, last_token: torch.Tensor,
               start: torch.Tensor, count: torch.Tensor) -> None:
        """The cycle's confirmed rows: the target's features {i: [M, H]} of them, tree_nodes [M] (the tree node of
        each row, increasing; -1 for a token that was not a tree node), last_token [1] (the last confirmed one),
        start [1] (their first slot, the old prefix length) and count [1]. Rows >= count are padding."""


class Drafter:
    """The base of every runtime drafter: the cycle's three calls, and the declared hooks (module docstring).
    A hook a drafter does not declare in `caps` raises here."""

    caps: DrafterCaps = DrafterCaps()
    feature_layers: List[int]
    """Target hidden-state indices (input of decoder layer i; 0 = embeddings) that `ingest` reads."""
    d2t: torch.Tensor
    """[Vd] int64 offsets: target id of draft index i is i + d2t[i]."""
    variant: int = 0
    """The draft drafting now, for drafters holding several (CUDA graphs are captured per variant)."""
    verify_start_layer: int = 0
    """The target layer a verify over this drafter's shallow states starts at: caps.shallow_layers, or lower after
    `set_verify_start_layer` (0: the drafter runs none of the target)."""

    def allocate(self, max_len: int, scratch: int, device: torch.device, dtype: torch.dtype) -> None:
        """Static caches for `max_len` confirmed slots plus `scratch` drafting slots; resets the prefix."""
        raise NotImplementedError

    def state_tensors(self) -> List[torch.Tensor]:
        """Tensors a captured cycle mutates (saved and restored around a CUDA graph's warm-up runs)."""
        return []

    def begin(self, context: Mapping[str, torch.Tensor]) -> None:
        """A new prompt's extra context (the names `caps.context` declares), before its prefill."""
        missing = [name for name in self.caps.context if name not in context]
        if missing:
            raise SpecdraftError(f"this draft needs prompt context {missing} besides the token ids")

    def ingest(self, features: Dict[int, torch.Tensor], next_tokens: torch.Tensor, start: torch.Tensor,
               count: torch.Tensor) -> None:
        """features {i: [M, H]}, next_tokens [M], start [1], count [1] (both int64; read during the call only: the
        engine advances `start`, its prefix length, right after)."""
        raise NotImplementedError

    def ingest_prompt(self, features: Dict[int, torch.Tensor], next_tokens: torch.Tensor, start: torch.Tensor,
                      count: torch.Tensor) -> None:
        """The prompt's rows at its prefill (start 0), as `ingest` takes them; `ingest` itself by default."""
        self.ingest(features, next_tokens, start, count)

    def first(self, root_token: torch.Tensor, position: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """root_token [1], position [1] -> (logits [1, Vd], hidden [1, Hd])."""
        raise NotImplementedError

    def step(self, depth: int, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             scratch_slots: torch.Tensor, scratch_visible: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """hidden [k, Hd], tokens [k], positions [k], scratch_slots [k], scratch_visible [k, W]."""
        raise NotImplementedError

    # ---- declared hooks -------------------------------------------------------------------------------
    def _undeclared(self, hook: str, cap: str) -> SpecdraftError:
        return SpecdraftError(f"{type(self).__name__} does not declare {cap}, which {hook} needs")

    def set_verify_start_layer(self, layer: int) -> None:
        raise self._undeclared("set_verify_start_layer", "shallow_layers")

    def chain_verify_states(self, tokens: torch.Tensor, positions: torch.Tensor, computed: int) -> torch.Tensor:
        raise self._undeclared("chain_verify_states", "shallow_layers")

    def keep_tree_states(self, num_candidates: int) -> None:
        raise self._undeclared("keep_tree_states", "shallow_tree")

    def tree_candidates(self, tokens: torch.Tensor, positions: torch.Tensor, first: int, paths: torch.Tensor,
                        frontier: torch.Tensor) -> None:
        raise self._undeclared("tree_candidates", "shallow_tree")

    def tree_verify_states(self, candidate_ids: torch.Tensor) -> torch.Tensor:
        raise self._undeclared("tree_verify_states", "shallow_tree")

    def select_exit(self, index: int) -> None:
        raise self._undeclared("select_exit", "exit_layers")

    def tree_scorer(self) -> TreeScorer:
        raise self._undeclared("tree_scorer", "scores_tree")

    def node_judge(self) -> NodeJudge:
        raise self._undeclared("node_judge", "judges")

    def propose(self, root_token: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
        """root_token [1], prefix_len [1] int64 (the root's position n) -> draft_logits [B - 1, Vd] (module
        docstring)."""
        raise self._undeclared("propose", "block_size")


class ExtendedDrafter(Drafter):
    """A base drafter with an add-on's hooks (a tree scorer, a judge) declared beside its own capabilities: the
    cycle's calls and the base's own hooks all go to the base."""

    def __init__(self, base: Drafter, scorer: Optional[TreeScorer] = None, judge: Optional[NodeJudge] = None):
        self.base, self.scorer, self.judge = base, scorer, judge
        self.caps = replace(base.caps, scores_tree=scorer is not None or base.caps.scores_tree,
                            judges=judge is not None or base.caps.judges)
        self.feature_layers, self.d2t = base.feature_layers, base.d2t

    @property
    def variant(self) -> int:
        return self.base.variant

    @property
    def verify_start_layer(self) -> int:
        return self.base.verify_start_layer

    def tree_scorer(self) -> TreeScorer:
        return self.scorer if self.scorer is not None else self.base.tree_scorer()

    def node_judge(self) -> NodeJudge:
        return self.judge if self.judge is not None else self.base.node_judge()

    def allocate(self, max_len, scratch, device, dtype) -> None:
        self.base.allocate(max_len, scratch, device, dtype)

    def state_tensors(self) -> List[torch.Tensor]:
        return self.base.state_tensors()

    def begin(self, context) -> None:
        self.base.begin(context)

    def ingest(self, features, next_tokens, start, count) -> None:
        self.base.ingest(features, next_tokens, start, count)

    def ingest_prompt(self, features, next_tokens, start, count) -> None:
        self.base.ingest_prompt(features, next_tokens, start, count)

    def first(self, root_token, position):
        return self.base.first(root_token, position)

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        return self.base.step(depth, hidden, tokens, positions, scratch_slots, scratch_visible)

    def set_verify_start_layer(self, layer: int) -> None:
        self.base.set_verify_start_layer(layer)

    def chain_verify_states(self, tokens, positions, computed: int):
        return self.base.chain_verify_states(tokens, positions, computed)

    def keep_tree_states(self, num_candidates: int) -> None:
        self.base.keep_tree_states(num_candidates)

    def tree_candidates(self, tokens, positions, first: int, paths, frontier) -> None:
        self.base.tree_candidates(tokens, positions, first, paths, frontier)

    def tree_verify_states(self, candidate_ids):
        return self.base.tree_verify_states(candidate_ids)

    def select_exit(self, index: int) -> None:
        self.base.select_exit(index)

    def propose(self, root_token, prefix_len):
        return self.base.propose(root_token, prefix_len)
