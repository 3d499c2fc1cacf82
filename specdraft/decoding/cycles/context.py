"""`CycleContext`: what every cycle kind reads and writes, and the steps they share.

The state: the verifier (`target`, its static KV cache) and the `drafter`, the confirmed prefix on the device
(`prefix_len` [1], the slot the next root goes to; `root` [1], the newest confirmed token), the target layers the
drafter reads (`capture`), the engine's graph cache, the tree scorer and where it prunes, an intermediate model's
stage. The steps, all on the device with static shapes:
  1. `build_tree` (tree.py): the drafter's tree from the root, pruned by the scorer when there is one (dropped
     candidates become padding), narrowed to a chain by an intermediate model (hierarchy.py);
  2. `verify`: the tree's N nodes through the target at cache slots P..P+N-1 with tree attention (P = prefix_len),
     capturing the hidden states the drafter reads;
  3. `accept_and_commit`: the acceptance rule's path (accept.py), the accepted nodes' KV entries moved to slots
     P..P+m (`kernels.kv_compact`), their hidden states handed to the drafter (`Drafter.ingest`), the bonus token as
     the new root; what the host reads of the cycle (`CycleOutput.for_host`).
The draft vocabulary's map (`d2t`) the cycles read is the engine's checked copy (vocabulary.py): a draft's ids can
cost acceptance, never name a token outside the target's vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from specdraft.config import PruneAt
from specdraft.core.drafting import Drafter, TreeScorer
from specdraft.kernels.kv_compact import compact_kv
from specdraft.kernels.path_commit import commit_path
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.graphs import CallGraph, GraphCache
from specdraft.decoding.hierarchy import HierarchicalStage
from specdraft.decoding.outputs import CycleOutput
from specdraft.decoding.sampled_drafts import DraftDraws, draw_exponential
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.tree import DraftTree, TreeExpansion, build_tree
from specdraft.decoding.verifier import VerifierModel
from specdraft.decoding.vocabulary import checked_d2t


class Verified(NamedTuple):
    """The target's pass over a tree's N nodes."""
    logits: torch.Tensor  # [N, V]
    captured: Dict[int, torch.Tensor]  # {layer: [N, H]} the inputs of the layers in `capture`
    hidden: torch.Tensor  # [N, H] the last layer's states before the final norm


@dataclass
class CycleContext:
    target: VerifierModel
    drafter: Optional[Drafter]  # None: an engine of the target alone (plain decoding)
    prefix_len: torch.Tensor  # [1] int64: confirmed tokens in the target's cache, the root's slot
    root: torch.Tensor  # [1] int64: the newest confirmed token, the root of the next cycle's tree
    capture: List[int]  # target layers (their inputs; 0: the embeddings) the drafter and an intermediate read
    graphs: GraphCache
    stage: Optional[HierarchicalStage] = None  # narrows each drafted tree to a chain (hierarchy.py)
    tree_start_layer: int = 0  # a tree's verify starts here, from the drafter's candidate states (0: embeddings)
    scorer: Optional[TreeScorer] = None  # drops candidates while a tree is drafted (core/drafting.py)
    prune_at: PruneAt = "selection"  # where the scorer drops them (tree.py)
    sample_drafts: bool = True  # at T > 0, each expanded node's first child sampled (sampled_drafts.py)
    trace_target_choices: bool = False  # each cycle keeps the target's argmax after every node (`target_next`)
    most_tokens: int = 1  # the most tokens a cycle of the engine emits: the host reads that many of each
    checked_d2t: Dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)  # per drafter variant

    @property
    def device(self) -> torch.device:
        return self.prefix_len.device

    @property
    def d2t(self) -> torch.Tensor:
        """[Vd] the drafting draft's vocabulary map, checked against the target's vocabulary (vocabulary.py)."""
        return self.check_vocabulary()

    def check_vocabulary(self) -> torch.Tensor:
        """The drafting draft's vocabulary map checked (once a drafter variant, on the host: the engine checks the
        first before any graph is captured) -> the map the cycles read."""
        variant = self.drafter.variant
        checked = self.checked_d2t.get(variant)
        if checked is None:
            checked = self.checked_d2t[variant] = checked_d2t(self.drafter.d2t, self.target.info.vocab_size)
        return checked

    # ---- graphs -----------------------------------------------------------------------------------------------
    def state_tensors(self) -> List[torch.Tensor]:
        """Tensors a captured cycle mutates, saved and restored around its warm-up runs."""
        tensors = [self.prefix_len, self.root, self.target.k_cache, self.target.v_cache]
        tensors += self.stage.state_tensors() if self.stage is not None else []
        return tensors + (self.drafter.state_tensors() if self.drafter is not None else [])

    def graph(self, key: Hashable, fn: Callable, extra_state: Sequence[torch.Tensor] = (),
              example: Sequence[torch.Tensor] = ()) -> CallGraph:
        """The CUDA graph of fn under `key` (state: `state_tensors` and `extra_state`), made at the first request."""
        return self.graphs.get(key, fn, lambda: self.state_tensors() + list(extra_state), example)

    def graphed(self, key: Hashable, fn: Callable, *args: torch.Tensor, extra_state: Sequence[torch.Tensor] = ()):
        """fn(*args), replayed from its graph under `key` when the engine uses graphs (state: `state_tensors` and
        `extra_state`, what else fn mutates)."""
        return self.graphs.run(key, fn, args, lambda: self.state_tensors() + list(extra_state))

    def scored_key(self, key: str) -> str:
        """The key of a graph whose body may run the tree scorer: one graph per scorer and place it prunes at (and
        one without)."""
        return key if self.scorer is None else f"{key}:scorer{id(self.scorer)}@{self.prune_at}"

    # ---- random inputs (drawn outside any graph) --------------------------------------------------------------
    def draft_noise(self, acceptance: Acceptance, rows: int, generator) -> Optional[torch.Tensor]:
        """Exp(1) noise [rows, Vd] for a cycle's sampled drafts, or None when the cycle drafts point masses (T = 0,
        or sample_drafts off)."""
        if not (self.sample_drafts and acceptance.temperature > 0):
            return None
        return draw_exponential(rows, self.d2t.shape[0], generator, self.device)

    def draws(self, acceptance: Acceptance, noise: Optional[torch.Tensor]) -> Optional[DraftDraws]:
        """The sampled drafts' draws of a cycle under `acceptance` from its noise (None: point-mass drafts)."""
        return None if noise is None else DraftDraws(acceptance.temperature, noise)

    def tree_inputs(self, acceptance: Acceptance, nodes: int, shape: TreeShape, generator) -> Tuple[torch.Tensor, ...]:
        """The random inputs of a tree cycle of `shape` verifying `nodes` nodes: (uniforms[, Exp(1) noise of each
        expanded node, when its drafts are sampled]), or () at T = 0."""
        randomness = acceptance.randomness(nodes, generator, self.device)
        if randomness is None:
            return ()
        noise = self.draft_noise(acceptance, shape.expanded_rows, generator)
        return (randomness,) if noise is None else (randomness, noise)

    # ---- the shared steps -------------------------------------------------------------------------------------
    def expansion(self, shape: TreeShape, draws: Optional[DraftDraws] = None) -> TreeExpansion:
        """A tree expansion of `shape` from the root (tree.py), with the tree scorer when there is one."""
        return TreeExpansion(self.drafter, shape, self.root, self.prefix_len, self.tree_start_layer > 0,
                             self.scorer, draws, self.prune_at, self.d2t)

    def build_tree(self, shape: TreeShape, draws: Optional[DraftDraws] = None) -> DraftTree:
        """This cycle's tree of `shape` from the root (step 1); draws: its sampled drafts at T > 0."""
        tree = build_tree(self.drafter, shape, self.root, self.prefix_len, self.tree_start_layer > 0, self.scorer,
                          draws, self.prune_at, self.d2t)
        return tree if self.stage is None else self.stage.narrow(tree, self.prefix_len)

    def verify(self, tree: DraftTree, start_layer: Optional[int] = None) -> Verified:
        """The tree's N nodes through the target (step 2), from `start_layer` (default the tree's: the drafter's
        candidate states when it kept them; 0: the embeddings of the tree's tokens)."""
        start_layer = self.tree_start_layer if start_layer is None else start_layer
        if start_layer:
            states = self.drafter.tree_verify_states(tree.candidate_ids)  # [N, H] entering the start layer
        else:
            states = self.target.embed(tree.tokens)  # [N, H]
        hidden, captured = self.target.run_layers(states, self.prefix_len + tree.depths, self.prefix_len,
                                                  tree.tree_mask, start_layer, capture=self.capture)
        return Verified(self.target.logits(hidden), captured, hidden)

    def commit(self, tree: DraftTree, captured: Dict[int, torch.Tensor], accepted_nodes: torch.Tensor,
               accept_length: torch.Tensor, bonus: torch.Tensor) -> CycleOutput:
        """Caches compacted to the accepted path, the path handed to the drafter, the root moved (step 3)."""
        committed = commit_path(accepted_nodes, accept_length, bonus, tree.tokens, self.prefix_len,
                                [captured[i] for i in self.capture], self.root)
        compact_kv(self.target.k_cache, self.target.v_cache, committed.src_slots, self.prefix_len, committed.count)
        features = dict(zip(self.capture, committed.features))
        self.drafter.ingest(features, committed.next_tokens, self.prefix_len, committed.count)  # before the add
        if self.stage is not None:
            self.stage.commit(features, accepted_nodes, accept_length, self.prefix_len, committed.count)
        self.prefix_len.add_(committed.count)
        return CycleOutput(emitted=committed.emitted, count=committed.count, accepted_nodes=accepted_nodes,
                           tree=tree, for_host=committed.for_host)

    def accept_and_commit(self, acceptance: Acceptance, tree: DraftTree, verified: Verified, depth_limit: int,
                          randomness: Optional[torch.Tensor] = None) -> CycleOutput:
        """The acceptance rule's path through the verified tree (at most `depth_limit` drafted nodes), committed.
        With a tree scorer the host also reads how many nodes the tree verified, at a fixed place past the tokens."""
        logits, captured, hidden = verified
        accepted_nodes, accept_length, bonus = acceptance.accept(logits, tree, depth_limit, randomness, hidden)
        out = self.commit(tree, captured, accepted_nodes, accept_length, bonus)
        if self.trace_target_choices:
            out.target_next = logits.argmax(-1)  # [N]: what the target itself would emit after each node
        if self.scorer is not None:
            room = self.most_tokens + 1 - out.for_host.shape[0]  # the engine's cycles emit up to most_tokens
            padded = torch.nn.functional.pad(out.for_host, (0, room))  # [most_tokens + 1]
            out.for_host = torch.cat([padded, tree.valid.sum(0, keepdim=True)])
        return out

    def drafted_count(self, nodes: int) -> Optional[int]:
        """The drafted tokens a tree cycle of `nodes` nodes verifies; None where the host reads them from the
        cycle's output (a pruned tree's, `accept_and_commit`)."""
        return None if self.scorer is not None else nodes - 1
