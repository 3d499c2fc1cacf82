"""Speculative generation, batch 1: `SpecEngine` is the loop that picks a kind of draft-verify cycle and runs it.

Each cycle drafts from the root (the newest confirmed token), verifies in one target pass, keeps the accepted path
and the target's bonus token, all on the device with static shapes (on a GPU one CUDA graph a cycle, or a few):
decoding/cycles/ holds the kinds (the fixed tree, the chain, a pruned tree's sized verify, a tree that stops
early, retrieval drafts), cycles/base.py the interface one implements, cycles/context.py what they share
(`CycleContext`). The engine's own kind is its shape's: a chain (shape.topk == 1: `ChainCycle`, with η, a dynamic
exit, a verify above the shallow layers a drafter runs), a tree (`TreeCycle`; at T > 0 of `sampling_shape` when one
is given), or, with a tree scorer and `prune_verify` "kept", `SizedVerifyCycle`; a block drafter's (one that
declares `DrafterCaps.block_size`) is `BlockCycle`. A drafting policy
(decoding/policies/) may choose another kind per cycle. The acceptance rule comes from the temperature
(accept.py): at T=0 the deepest path whose tokens are the target's argmax, at T>0 recursive rejection sampling on
the device, or the opt-in learned rule of a draft that ships a judge. Hierarchical drafting (hierarchy.py: an
intermediate model narrows the tree to a chain; T=0) plugs into the context's tree building and commit.
Plain decoding (`decode_plain`) runs the same target one token at a time, the baseline for speedups.

Both loops start with the prefill (prefill.py): the prompt through the target and then the drafter, on a GPU in two
graphs per prompt length rounded up to `PREFILL_ROWS` (captured the first time a length is met; padding rows follow
the prompt, so causal attention keeps them out of its rows). Both keep one step in flight (`overlap`): step k+1 is
queued on the device before the host reads step k's tokens (`HostReader`, a copy that does not wait), so the
device does not idle while the host appends tokens, checks for EOS and launches the next graph. When the host finds
the end, the step in flight is dropped: its state lies past the answer, and the next prefill starts over. Neither
loop queues a step past the last token asked for: while the steps in flight may reach it (a cycle gives up to
`most_tokens`), the host reads them before it queues another, so the last cycles of an answer run one at a time and
none is wasted. Traces, and cycle kinds or policies that read every cycle (`reads_every_cycle`: a dynamic exit,
retrieval, a tree that stops early), run without the step in flight.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from specdraft.config import PruneAt, PruneSettings, PruneVerify, check_choices
from specdraft.core.drafting import Drafter, IntermediateModel, NodeJudge, TreeScorer
from specdraft.core.errors import SpecdraftError
from specdraft.decoding.accept import Acceptance, acceptance_for
from specdraft.decoding.cycles.base import CycleKind, CycleRun
from specdraft.decoding.cycles.block import BlockCycle
from specdraft.decoding.cycles.chain import ChainCycle
from specdraft.decoding.cycles.context import CycleContext, Verified
from specdraft.decoding.cycles.sized_verify import SizedVerifyCycle
from specdraft.decoding.cycles.tree import TreeCycle
from specdraft.decoding.graphs import CallGraph, GraphCache
from specdraft.decoding.hierarchy import hierarchical_stage
from specdraft.decoding.host_reader import HostReader
from specdraft.decoding.outputs import CycleOutput, GenerationResult, cut_answer, finished, trace_row
from specdraft.decoding.policies.base import DraftingPolicy, PolicySetup
from specdraft.decoding.policies.dynamic_exit import DynamicExit, dynamic_exit_for
from specdraft.decoding.prefill import PREFILL_ROWS, Prefill
from specdraft.decoding.sampled_drafts import DraftDraws
from specdraft.decoding.sampling import sample_token
from specdraft.decoding.shapes import TreeShape
from specdraft.decoding.tree import DraftTree, shallow_tree_start
from specdraft.decoding.verifier import VerifierModel


@dataclass
class EngineOptions:
    """How a SpecEngine drafts and verifies beyond its shape (runtime/load.py fills them from RuntimeConfig)."""

    exit_threshold: float = 0.0
    """Chains: η, stop drafting once the draft's top-1 probability falls below it (0: never)."""
    dynamic_exit: bool = False
    """Chains: DEL's choice of the draft length (and of the exit, for a drafter of several) per cycle."""
    reuse_shallow: bool = True
    """Chains: verify from the drafter's `verify_start_layer` when it declares shallow layers."""
    reuse_shallow_tree: bool = False
    """Trees: the same, when the drafter declares the tree hooks (core/drafting.py); a research option."""
    overlap: bool = True
    """One step in flight while the host reads the one before (off: each step read before the next is queued)."""
    tree_scorer: Optional[TreeScorer] = None
    """Drops candidates while a tree is drafted (in a chain: ends it); `set_tree_scorer` swaps it."""
    judge: Optional[NodeJudge] = None
    """Learned, lossy acceptance at T=0 (accept.py); `use_judge` swaps it."""
    intermediate: Optional[IntermediateModel] = None
    """A small model that narrows each drafted tree to a chain (hierarchy.py; trees, T=0)."""
    sample_drafts: bool = True
    """At T > 0, each expanded node's first child sampled from the draft (sampled_drafts.py)."""
    policy: Optional[DraftingPolicy] = None
    """The drafting policy that chooses each cycle's kind (decoding/policies/; None: "fixed", the engine's own)."""
    prune_at: PruneAt = "selection"
    """Where the tree scorer drops candidates (tree.py)."""
    prune_verify: PruneVerify = "kept"
    """What a pruned tree's verify holds: only the kept candidates (cycles/sized_verify.py) or the budget."""
    sampling_shape: Optional[TreeShape] = None
    """The fixed tree's shape at T > 0 (None: `shape` at every temperature)."""
    trace_target_choices: bool = False
    """Each cycle also keeps the target's own greedy choice after every node (one argmax more a cycle) for its trace
    rows (`target_next`): under a judge an accepted token need not be that choice (the judge's on-policy mining
    reads it)."""
    cycle_kind: Optional[Callable[[CycleContext, TreeShape], CycleKind]] = None
    """A cycle kind of the caller's in place of the engine's own (the chain, the fixed tree): made with the engine's
    context and shape (cycles/base.py: the interface; a block drafter's kind, say), verifying at most the shape's
    budget of rows (the cache room the engine keeps). None: the engine's own."""


def checked_prune_options(prune_at: str, prune_verify: str) -> Tuple[PruneAt, PruneVerify]:
    """(prune_at, prune_verify), or one line naming the bad one and the valid ones (config.py's one check)."""
    check_choices(PruneSettings(prune_at=prune_at, prune_verify=prune_verify), "runtime")
    return prune_at, prune_verify


class SpecEngine:
    """Owns a VerifierModel (with its static cache) and a Drafter; `generate` runs speculative decoding, choosing
    each cycle's kind (module docstring). Options: `EngineOptions`, as `options` or as keyword settings of its
    fields."""

    def __init__(self, target: VerifierModel, drafter: Optional[Drafter], shape: TreeShape, max_len: int,
                 rope_tables, use_graphs: Optional[bool] = None, options: Optional[EngineOptions] = None,
                 **settings):
        options = replace(options or EngineOptions(), **settings)
        self.target, self.drafter, self.shape, self.max_len = target, drafter, shape, max_len
        self.sampling_shape, self.overlap, self.judge = options.sampling_shape, options.overlap, options.judge
        self.shapes = (shape,) if self.sampling_shape is None else (shape, self.sampling_shape)  # what buffers hold
        self.prune_verify = checked_prune_options(options.prune_at, options.prune_verify)[1]
        self.device, self.dtype = target.device, target.dtype
        target.allocate(max_len, *rope_tables)
        if drafter is not None:
            drafter.allocate(max_len, max(s.scratch for s in self.shapes), self.device, self.dtype)
        self.context = self._context(options, use_graphs)
        self.chain = self._chain(options)
        self.set_exit_threshold(options.exit_threshold)
        self.own_kind = self._own_kind(options)
        self.policy = self._bind_policy(options.policy)
        self._trees: Dict[TreeShape, TreeCycle] = {}
        self._sized = SizedVerifyCycle(self.context, shape) if drafter is not None else None
        kinds = self._policy_kinds() + ([self.own_kind] if self.own_kind is not None else [])
        self.most_tokens = max([s.depth + 1 for s in self.shapes] + [kind.most_tokens for kind in kinds])
        self.context.most_tokens = self.most_tokens
        self._reader = HostReader(self.most_tokens + 2, self.device)  # count, tokens, then a pruned tree's nodes
        self._prefill = Prefill(self.context, PREFILL_ROWS if self.context.graphs.use_graphs else 1, max_len)
        self._acceptances: Dict[float, Acceptance] = {}
        self._one_mask = torch.ones(1, 1, dtype=torch.bool, device=self.device)  # plain decoding's tree mask
        self.verify_rows: Optional[int] = None  # the rows the verify of the cycle just queued runs

    # ---- construction ---------------------------------------------------------------------------------------
    def _context(self, options: EngineOptions, use_graphs: Optional[bool]) -> CycleContext:
        """The cycle context: the cache state, the graphs, how trees start, are scored and narrowed."""
        drafter, shape = self.drafter, self.shape
        intermediate = options.intermediate
        layers = set(intermediate.feature_layers) if intermediate is not None else set()
        capture = sorted(set(drafter.feature_layers) | layers) if drafter is not None else []
        chain = drafter is not None and shape.topk == 1
        tree_start = shallow_tree_start(drafter, capture, shape, chain, options.reuse_shallow_tree)
        stage = hierarchical_stage(intermediate, chain or tree_start > 0, shape, self.max_len, self.device,
                                   self.dtype)
        graphs = GraphCache(self.device.type == "cuda" if use_graphs is None else use_graphs)
        context = CycleContext(target=self.target, drafter=drafter, capture=capture, graphs=graphs,
                               prefix_len=torch.zeros(1, dtype=torch.long, device=self.device),
                               root=torch.zeros(1, dtype=torch.long, device=self.device), stage=stage,
                               tree_start_layer=tree_start, scorer=options.tree_scorer, prune_at=options.prune_at,
                               sample_drafts=options.sample_drafts, trace_target_choices=options.trace_target_choices)
        if drafter is not None:
            context.check_vocabulary()
        return context

    def _chain(self, options: EngineOptions) -> Optional[ChainCycle]:
        """The chain cycle kind when the engine drafts chains (shape.topk == 1), with its exits; none for a block
        drafter (its chains are BlockCycle's)."""
        if self.drafter is None or self.shape.topk != 1 or self.drafter.caps.block_size:
            return None
        reuse = options.reuse_shallow
        start = self.drafter.verify_start_layer if reuse and self.drafter.caps.shallow_layers else 0
        length_choice: Optional[DynamicExit] = None
        if options.dynamic_exit:
            length_choice = dynamic_exit_for(self.drafter.caps, self.shape.depth, self.target.info.num_layers - start)
        return ChainCycle(self.context, self.shape.depth, reuse, length_choice)

    def _own_kind(self, options: EngineOptions) -> Optional[CycleKind]:
        """The caller's cycle kind; else, for a drafter that declares block_size (core/drafting.py), `BlockCycle`;
        else None (the chain or the fixed tree)."""
        make = options.cycle_kind
        if make is None and self.drafter is not None and self.drafter.caps.block_size:
            if options.policy is not None or options.exit_threshold or options.dynamic_exit:
                raise SpecdraftError("a block drafter drafts its block in one pass: drop --policy, --exit-threshold "
                                     "and --dynamic-exit")
            make = BlockCycle
        return make(self.context, self.shape) if make is not None else None

    def _bind_policy(self, policy: Optional[DraftingPolicy]) -> Optional[DraftingPolicy]:
        """The drafting policy bound to the engine's setup, after what the fixed tree's own options refuse."""
        if policy is not None and self.context.stage is not None:
            raise SpecdraftError("an intermediate model (runtime.intermediate) narrows the fixed tree: drop --policy "
                                 "or --intermediate")
        if self.sampling_shape is not None and (self.chain is not None or self.context.tree_start_layer
                                                or self.context.stage is not None or policy is not None):
            raise SpecdraftError("a tree shape of its own at T > 0 is for the fixed tree verified from layer 0: not "
                                 "with a chain, a drafting policy, an intermediate model or --shallow-reuse-tree")
        if policy is not None:
            policy.bind(PolicySetup(self.context, self.shape, self.base_kind, self.chain))
        return policy

    def _policy_kinds(self) -> List[CycleKind]:
        return self.policy.kinds() if self.policy is not None else []

    # ---- settings that change between generations -------------------------------------------------------------
    @property
    def use_graphs(self) -> bool:
        return self.context.graphs.use_graphs

    @use_graphs.setter
    def use_graphs(self, value: bool) -> None:
        self.context.graphs.use_graphs = value

    @property
    def prefill_rows(self) -> int:
        """A prompt's rows round up to a multiple of this (graphs: PREFILL_ROWS; eager: 1)."""
        return self._prefill.rows

    @prefill_rows.setter
    def prefill_rows(self, rows: int) -> None:
        self._prefill.rows = rows

    @property
    def tree_scorer(self) -> Optional[TreeScorer]:
        return self.context.scorer

    @property
    def prune_at(self) -> PruneAt:
        return self.context.prune_at

    @property
    def sample_drafts(self) -> bool:
        return self.context.sample_drafts

    @sample_drafts.setter
    def sample_drafts(self, value: bool) -> None:
        self.context.sample_drafts = value

    @property
    def prefix_len(self) -> torch.Tensor:
        return self.context.prefix_len

    @property
    def root(self) -> torch.Tensor:
        return self.context.root

    @property
    def capture(self) -> List[int]:
        return self.context.capture

    @property
    def tree_start_layer(self) -> int:
        return self.context.tree_start_layer

    @property
    def stage(self):
        return self.context.stage

    @property
    def exit_threshold(self) -> float:
        return self.chain.exit_threshold if self.chain is not None else 0.0

    @property
    def dynamic_exit(self) -> Optional[DynamicExit]:
        return self.chain.length_choice if self.chain is not None else None

    def set_tree_scorer(self, scorer: Optional[TreeScorer]) -> None:
        """Draft with `scorer` from the next cycle on (None: unpruned); each scorer's cycles have graphs of their
        own (`scored_key`)."""
        self.context.scorer = scorer

    def set_prune_options(self, prune_at: Optional[str] = None, prune_verify: Optional[str] = None) -> None:
        """Where the tree scorer drops candidates and what the verify holds, from the next cycle on (None: as
        before); each has graphs of their own (`scored_key`)."""
        self.context.prune_at, self.prune_verify = checked_prune_options(prune_at or self.context.prune_at,
                                                                          prune_verify or self.prune_verify)

    def set_exit_threshold(self, eta: float) -> None:
        """η for chains: stop drafting once the draft's top-1 probability falls below it (0: never)."""
        if not 0.0 <= eta < 1.0:
            raise SpecdraftError(f"the exit threshold must be in [0, 1), got {eta}")
        if self.chain is not None:
            self.chain.set_exit_threshold(eta)

    def use_judge(self, judge: Optional[NodeJudge]) -> None:
        """Accept by `judge` (at its threshold) in the cycles from now on, or exactly with None; every acceptance
        rule is made again (a judged rule's CUDA graphs are keyed by its threshold)."""
        self.judge = judge
        self._acceptances.clear()

    def acceptance(self, temperature: float) -> Acceptance:
        """The acceptance rule of this engine's cycles at `temperature` (accept.py), made once per temperature."""
        acceptance = self._acceptances.get(temperature)
        if acceptance is None:  # checked once a temperature, not every cycle
            if self.context.stage is not None and temperature > 0:
                raise SpecdraftError(f"hierarchical drafting (runtime.intermediate) decodes greedily; got temperature "
                                     f"{temperature}: use 0, or leave the intermediate model out")
            acceptance = self._acceptances[temperature] = acceptance_for(temperature, self.judge)
        return acceptance

    def room_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """Cache slots a generation needs: the prompt, the answer, the last cycle's tree and the cycle in flight
        after it (up to `most_tokens` more)."""
        tree_slots = self.shape.num_candidates if self.tree_start_layer else max(s.budget for s in self.shapes)
        tree_slots += self.policy.extra_rows() if self.policy is not None else 0
        return prompt_len + max_new_tokens + self.most_tokens + tree_slots + max(s.scratch for s in self.shapes) + 1

    def policy_stats(self) -> Dict[str, int]:
        """The drafting policy's counters since the engine was built ({} without a policy)."""
        return self.policy.stats() if self.policy is not None else {}

    def _check_room(self, prompt_len: int, max_new_tokens: int) -> None:
        """The cache holds what `room_needed` counts, or the prompt is refused in one line."""
        need = self.room_needed(prompt_len, max_new_tokens)
        if need > self.max_len:
            raise SpecdraftError(f"prompt of {prompt_len} tokens + {max_new_tokens} new tokens needs {need} cache "
                                 f"slots; the cache has {self.max_len} (raise --max-len or shorten the prompt)")

    # ---- the cycle ------------------------------------------------------------------------------------------
    def shape_at(self, temperature: float) -> TreeShape:
        """The fixed tree's shape at `temperature`: `sampling_shape` at T > 0 when there is one (and no tree
        scorer, whose pruned verify is sized by `shape`), else `shape`."""
        if temperature > 0 and self.sampling_shape is not None and self.context.scorer is None:
            return self.sampling_shape
        return self.shape

    def sizes_verify(self) -> bool:
        """Whether a tree cycle verifies only the candidates its scorer keeps: a scorer, and prune_verify "kept",
        on a tree verified from layer 0 and not narrowed by an intermediate model."""
        context = self.context
        return (context.scorer is not None and self.prune_verify == "kept" and self.chain is None
                and not context.tree_start_layer and context.stage is None)

    def base_kind(self, acceptance: Acceptance) -> CycleKind:
        """The engine's own cycle kind under `acceptance`: the caller's (`EngineOptions.cycle_kind`), the chain, a
        pruned tree's sized verify, or the fixed tree of `shape_at` its temperature."""
        if self.own_kind is not None:
            return self.own_kind
        if self.chain is not None:
            return self.chain
        if self.sizes_verify():
            return self._sized
        shape = self.shape_at(acceptance.temperature)
        tree = self._trees.get(shape)
        if tree is None:
            tree = self._trees[shape] = TreeCycle(self.context, shape)
        return tree

    def next_kind(self, acceptance: Acceptance) -> CycleKind:
        """The kind of the next cycle: the drafting policy's choice, else the engine's own."""
        return self.policy.choose(acceptance) if self.policy is not None else self.base_kind(acceptance)

    def cycle(self, temperature: float, generator) -> CycleRun:
        """One cycle at `temperature`, queued on the device (the drafting policy's choice of kind when there is
        one)."""
        acceptance = self.acceptance(temperature)
        run = self.next_kind(acceptance).run(acceptance, generator)
        self.verify_rows = run.verify_rows
        return run

    # ---- the phases, for profiling and counting (runtime/profile.py, tools/count_cycle_launches.py) ----------
    def build_tree(self, draws: Optional[DraftDraws] = None, shape: Optional[TreeShape] = None) -> DraftTree:
        if shape is None and isinstance(self.own_kind, BlockCycle):  # a block drafter drafts by its proposals
            return self.own_kind.draft(draws)
        return self.context.build_tree(shape or self.shape, draws)

    def verify_forward(self, tree: DraftTree) -> Verified:
        return self.context.verify(tree)

    def accept_and_commit(self, acceptance: Acceptance, tree: DraftTree, verified: Verified, randomness=None,
                          depth_limit: Optional[int] = None) -> CycleOutput:
        depth_limit = self.shape.depth if depth_limit is None else depth_limit
        return self.context.accept_and_commit(acceptance, tree, verified, depth_limit, randomness)

    def draft_noise(self, acceptance: Acceptance, rows: int, generator) -> Optional[torch.Tensor]:
        return self.context.draft_noise(acceptance, rows, generator)

    def draws(self, acceptance: Acceptance, noise: Optional[torch.Tensor]) -> Optional[DraftDraws]:
        return self.context.draws(acceptance, noise)

    def cycle_args(self, acceptance: Acceptance, nodes: int, generator,
                   shape: Optional[TreeShape] = None) -> Tuple[torch.Tensor, ...]:
        return self.context.tree_inputs(acceptance, nodes, shape or self.shape, generator)

    def state_tensors(self) -> List[torch.Tensor]:
        return self.context.state_tensors()

    def graph(self, key: str, fn, state: List[torch.Tensor], example: Sequence[torch.Tensor] = ()) -> CallGraph:
        """The engine's CUDA graph of fn under `key`, made at the first request with `state` (what fn mutates)."""
        return self.context.graphs.get(key, fn, lambda: state, example)

    def scored_key(self, key: str) -> str:
        return self.context.scored_key(key)

    @property
    def graphs(self) -> GraphCache:
        return self.context.graphs

    # ---- loops --------------------------------------------------------------------------------------------
    def prefill(self, prompt_ids: torch.Tensor, temperature: float, generator=None,
                prompt_embeds: Optional[torch.Tensor] = None, context: Optional[Mapping[str, torch.Tensor]] = None,
                prompt_rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                meanwhile: Optional[Callable[[], None]] = None) -> int:
        """prompt_ids [P] on the device: fills the caches, returns the first new token (prefill.py says how, and
        what `prompt_embeds`, `context` (the drafter's extra prompt context), `prompt_rope` and `meanwhile` are)."""
        return self._prefill.run(prompt_ids, temperature, generator, prompt_embeds, context, prompt_rope, meanwhile)

    def _reads_every_cycle(self, trace: bool) -> bool:
        """Whether the host reads each cycle before it queues the next: traces, and kinds or a policy that read
        every cycle."""
        own_reads = any(kind.reads_every_cycle for kind in self._own_kinds())
        return trace or own_reads or (self.policy is not None and self.policy.reads_every_cycle)

    def _own_kinds(self) -> List[CycleKind]:
        """The kinds the engine keeps state across cycles for (begun with each generation): the chain, the
        caller's."""
        return [kind for kind in (self.chain, self.own_kind) if kind is not None]

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = (),
                 temperature: float = 0.0, generator: Optional[torch.Generator] = None, trace: bool = False,
                 prompt_embeds: Optional[torch.Tensor] = None,
                 context: Optional[Mapping[str, torch.Tensor]] = None,
                 prompt_rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> GenerationResult:
        """Speculative decoding of `prompt_ids` -> the new tokens and the accepted count of every cycle.
        `prompt_embeds`, `context` and `prompt_rope`: see `prefill`."""
        if self.drafter is None:
            raise SpecdraftError("this engine has no draft; use decode_plain")
        self._check_room(len(prompt_ids), max_new_tokens)
        self._sync()
        started = time.perf_counter()
        prompt = torch.tensor(list(prompt_ids), device=self.device)
        begin = (lambda: self.policy.begin(list(prompt_ids))) if self.policy is not None else None
        generated = [self.prefill(prompt, temperature, generator, prompt_embeds, context, prompt_rope,
                                  meanwhile=begin)]
        result = GenerationResult(tokens=generated)
        for kind in self._own_kinds():
            kind.begin()
        if self.policy is not None:
            self.policy.observe(generated)
        done = finished(generated, generated, eos_ids, max_new_tokens)
        ahead = 1 if self.overlap and not self._reads_every_cycle(trace) else 0  # cycles queued past the read
        read = self.most_tokens + 1 + (self.tree_scorer is not None)  # + a pruned tree's valid nodes
        queued = deque()
        while not done:
            may_end = len(generated) + self.most_tokens * len(queued) >= max_new_tokens  # by the cycles in flight
            if not (queued and may_end):  # else read them first: no cycle runs past the last token asked for
                acceptance = self.acceptance(temperature)
                kind = self.next_kind(acceptance)
                run = kind.run(acceptance, generator)
                self.verify_rows = run.verify_rows
                queued.append((self._reader.stage(run.output.for_host), kind, run))
                if len(queued) <= ahead:
                    continue
            slot, kind, run = queued.popleft()
            host = self._reader.read(slot, read)  # the one host wait of a cycle
            new_tokens, accepted = host[1:1 + host[0]], host[0] - 1
            generated += new_tokens
            if self.policy is not None:
                self.policy.observe(new_tokens)
            done = finished(generated, new_tokens, eos_ids, max_new_tokens)
            result.accepted.append(accepted)
            result.drafted.append(host[-1] - 1 if run.drafted is None else run.drafted)  # a pruned tree's: its nodes
            result.exits.append(run.exit_index)
            result.verify_rows.append(run.verify_rows)
            kind.observe(run, accepted)
            if trace:
                result.trace.append(trace_row(run.output))
        result.tokens = cut_answer(generated, eos_ids, max_new_tokens)
        self._sync()
        result.seconds = time.perf_counter() - started
        return result

    def plain_step(self, token: torch.Tensor) -> torch.Tensor:
        """token [1] at position prefix_len -> its target logits [1, V]; advances the prefix."""
        prefix_len = self.context.prefix_len
        hidden, _ = self.target.run_layers(self.target.embed(token), prefix_len, prefix_len, self._one_mask)
        prefix_len.add_(1)
        return self.target.logits(hidden)

    def plain_stepper(self, token: torch.Tensor):
        """`plain_step` as decoding runs it: its CUDA graph (captured at the first call) when the engine uses
        graphs. token [1]: an example of its argument."""
        if not self.use_graphs:
            return self.plain_step
        state = [self.context.prefix_len, self.target.k_cache, self.target.v_cache]
        return self.context.graphs.get("plain", self.plain_step, lambda: state, (token,))

    @torch.no_grad()
    def decode_plain(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = (),
                     temperature: float = 0.0, generator: Optional[torch.Generator] = None,
                     prompt_embeds: Optional[torch.Tensor] = None,
                     context: Optional[Mapping[str, torch.Tensor]] = None,
                     prompt_rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> GenerationResult:
        """The target alone, one token per forward, in this runtime (static cache, CUDA graph on GPU).
        `prompt_embeds`, `context` and `prompt_rope`: see `prefill`."""
        self._check_room(len(prompt_ids), max_new_tokens)
        self._sync()
        started = time.perf_counter()
        prompt = torch.tensor(list(prompt_ids), device=self.device)
        generated = [self.prefill(prompt, temperature, generator, prompt_embeds, context, prompt_rope)]
        token = self.root.clone()
        step = self.plain_stepper(token)
        done = finished(generated, generated, eos_ids, max_new_tokens)
        ahead, queued = (1 if self.overlap else 0), deque()  # slots of the steps queued, not yet read
        while not done:
            if len(generated) + len(queued) < max_new_tokens:  # no step past the last one asked for
                token = sample_token(step(token), temperature, generator)
                queued.append(self._reader.stage(token))
                if len(queued) <= ahead:
                    continue
            generated.append(self._reader.read(queued.popleft(), 1)[0])
            done = finished(generated, generated[-1:], eos_ids, max_new_tokens)
        result = GenerationResult(tokens=cut_answer(generated, eos_ids, max_new_tokens))
        self._sync()
        result.seconds = time.perf_counter() - started
        return result

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
