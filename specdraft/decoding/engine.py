"""Speculative generation, batch 1: draft a tree, verify it in one target pass, keep the accepted path.

One cycle, all on the device with static shapes (so that on a GPU it is one CUDA graph, see graphs.py):
  1. the drafter builds the tree from the root (the newest confirmed token), `tree.build_tree` (a draft's tree
     scorer may drop candidates, `prune_at`: they become padding, and the host reads how many nodes the
     cycle verified, `GenerationResult.drafted`);
  2. the target runs the tree's N nodes at cache slots P..P+N-1 with tree attention (P = confirmed tokens
     before the root), capturing the hidden states the drafter reads;
  3. acceptance, by the engine's policy for the temperature (`accept.py`): at T=0 the deepest path whose
     tokens are the target's argmax, at T>0 recursive rejection sampling on the device (with uniforms drawn
     before the cycle), or the opt-in learned rule of a draft that ships a judge; the bonus token is the
     target's own next token;
  4. the accepted nodes' KV entries move to slots P..P+m (`kernels.kv_compact`) and their hidden states go to
     the drafter (`Drafter.ingest`); the bonus becomes the root.
Variants of the cycle, each in its own module: chains (shape.topk == 1, `chain.ChainCycles`: the confidence exit
η, the dynamic draft length of `dynamic_exit.py`, a verify that starts above the shallow layers a drafter runs);
trees whose verify starts above them too (`reuse_shallow_tree`, tree.py: C = shape.num_candidates rows a cycle in
one more shallow pass, no fewer launches and more rows, so off by default: on an H100 0.72x plain against 0.88x);
hierarchical drafting (hierarchy.py: an intermediate model narrows the tree to a chain; T=0); drafting policies
that choose each cycle on the host (drafting_policy.py: retrieval drafts, `retrieval_cycles.py`; trees that stop
early, `depth_stop.py`) and a chain's stop rules (stop_rules.py); sampled first children at T > 0
(sampled_drafts.py, `sample_drafts`); and, with a tree scorer, a verify of only the kept nodes (sized_verify.py,
`prune_verify` "kept"; "budget": the budget's rows, the pruned ones as padding).
Plain decoding (`decode_plain`) runs the same target one token at a time, the baseline for speedups.
Both start with `prefill` (prefill.py): the prompt through the target and then the drafter, on a GPU in two graphs per
prompt length rounded up to `PREFILL_ROWS` (captured the first time a length is met; padding rows follow the
prompt, so causal attention keeps them out of its rows).
Both loops keep one step in flight (`overlap`): step k+1 is queued on the device before the host reads step k's
tokens (`HostReader`, a copy that does not wait), so the device does not idle while the host appends tokens,
checks for EOS and launches the next graph. When the host finds the end, the step in flight is dropped: its
state lies past the answer, and the next prefill starts over. Neither loop queues a step past the last token
asked for: while the steps in flight may reach it (a cycle gives up to depth + 1 tokens), the host reads them
before it queues another, so the last cycles of an answer run one at a time and none is wasted. Traces and the
dynamic exit read every cycle before the next one, so they run without the step in flight.
"""
from __future__ import annotations

import time
from collections import deque
from functools import partial
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from specdraft.core.drafting import Drafter, IntermediateModel, NodeJudge, TreeScorer
from specdraft.core.errors import SpecdraftError
from specdraft.kernels.kv_compact import compact_kv
from specdraft.kernels.path_commit import commit_path
from specdraft.decoding.accept import Acceptance, acceptance_for
from specdraft.decoding.chain import ChainCycles
from specdraft.decoding.drafting_policy import DraftingPolicy
from specdraft.decoding.dynamic_exit import dynamic_exit_for
from specdraft.decoding.graphs import CallGraph
from specdraft.decoding.hierarchy import hierarchical_stage
from specdraft.decoding.host_reader import HostReader
from specdraft.decoding.sampling import sample_token
from specdraft.decoding.target import TargetModel
from specdraft.decoding.sampled_drafts import DraftDraws, draw_exponential
from specdraft.decoding.stop_rules import StopRule
from specdraft.decoding.outputs import CycleOutput, GenerationResult, cut_answer, finished, trace_row
from specdraft.decoding.prefill import PREFILL_ROWS, prefill
from specdraft.decoding.sized_verify import SizedVerify, checked_prune_options
from specdraft.decoding.tree import DraftTree, TreeExpansion, TreeShape, build_tree, shallow_tree_start




class SpecEngine:
    """Owns a TargetModel (with its static cache) and a Drafter; `generate` runs speculative decoding.

    Chain options: `exit_threshold` η (0: off), `dynamic_exit` (DEL's draft length), `reuse_shallow` (verify
    from the drafter's `verify_start_layer` when it declares shallow layers). Tree options: `reuse_shallow_tree`,
    the same for trees when the drafter declares the tree hooks (core/drafting.py); off by default (module
    docstring: what it costs); `tree_scorer`, which may drop candidates (in a chain: end it,
    chain.py; `set_tree_scorer` swaps it) during the expansion or from the selection (`prune_at`, tree.py), the
    verify then holding the kept ones alone (`prune_verify` "kept", module docstring) or the budget ("budget").
    `judge`: learned, lossy acceptance at T=0 (accept.py).
    `overlap` (both loops): one step in flight while the host reads the one before; off, each step is read before
    the next is queued (to time one against the other). `intermediate`: a small model that narrows each drafted
    tree to a sequence (hierarchy.py; trees, T=0). `sample_drafts`: at T > 0, sampled first children
    (sampled_drafts.py). `chain_stop`: a chain's stop rule besides η (stop_rules.py). `policy`: a drafting policy
    that chooses each cycle (drafting_policy.py). `sampling_shape`: the fixed tree's shape at T > 0 (None: `shape`
    at every temperature): smaller trees pay more there, where fewer drafts are accepted (docs/benchmarks.md)."""

    def __init__(self, target: TargetModel, drafter: Optional[Drafter], shape: TreeShape, max_len: int,
                 rope_tables, use_graphs: Optional[bool] = None, exit_threshold: float = 0.0,
                 dynamic_exit: bool = False, reuse_shallow: bool = True, reuse_shallow_tree: bool = False,
                 overlap: bool = True, tree_scorer: Optional[TreeScorer] = None, judge: Optional[NodeJudge] = None,
                 intermediate: Optional[IntermediateModel] = None, sample_drafts: bool = True,
                 chain_stop: Optional[StopRule] = None, policy: Optional[DraftingPolicy] = None,
                 prune_at: str = "selection", prune_verify: str = "kept",
                 sampling_shape: Optional[TreeShape] = None, trace_target_choices: bool = False):
        """trace_target_choices: each cycle also keeps the target's own greedy choice after every node (one argmax
        more a cycle) for its trace rows (`target_next`): under a judge an accepted token need not be that choice
        (the judge's on-policy mining reads it)."""
        self.target, self.drafter, self.shape, self.max_len = target, drafter, shape, max_len
        self.trace_target_choices = trace_target_choices
        self.sampling_shape = sampling_shape  # the fixed tree's shape at T > 0 (None: `shape`)
        self.shapes = (shape,) if sampling_shape is None else (shape, sampling_shape)  # what the buffers must hold
        self.prune_at, self.prune_verify = checked_prune_options(prune_at, prune_verify)
        self.sample_drafts = sample_drafts  # at T > 0, each expanded node's first child sampled (sampled_drafts.py)
        self.overlap = overlap  # keep one step in flight while the host reads the one before (module docstring)
        self.device = target.device
        self.dtype = target.dtype
        target.allocate(max_len, *rope_tables)
        if drafter is not None:
            drafter.allocate(max_len, max(s.scratch for s in self.shapes), self.device, self.dtype)
        layers = set(intermediate.feature_layers) if intermediate is not None else set()
        self.capture = sorted(set(drafter.feature_layers) | layers) if drafter is not None else []
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.prefix_len = torch.zeros(1, dtype=torch.long, device=self.device)
        self.root = torch.zeros(1, dtype=torch.long, device=self.device)
        self._one_mask = torch.ones(1, 1, dtype=torch.bool, device=self.device)  # plain decoding's tree mask
        self._graphs: Dict[str, CallGraph] = {}
        self.prefill_rows = PREFILL_ROWS if self.use_graphs else 1  # a prompt's rows round up to a multiple of it
        self.tree_scorer, self.judge = tree_scorer, judge
        self._policies: Dict[float, Acceptance] = {}
        self.chain = ChainCycles(self, reuse_shallow) if drafter is not None and shape.topk == 1 else None
        self.tree_start_layer = shallow_tree_start(drafter, self.capture, shape, self.chain is not None,
                                                   reuse_shallow_tree)
        self.stage = hierarchical_stage(intermediate, self.chain is not None or self.tree_start_layer > 0, shape,
                                        max_len, self.device, self.dtype)
        self.dynamic_exit = None if not (dynamic_exit and self.chain is not None) else \
            dynamic_exit_for(drafter.caps, shape.depth, target.info.num_layers - self.chain.start_layer)
        self.exit_index = 0  # the exit the dynamic exit chose for the cycle in flight
        self.set_exit_threshold(exit_threshold)
        if chain_stop is not None:
            self._set_chain_stop(chain_stop)
        if policy is not None and self.stage is not None:
            raise SpecdraftError("an intermediate model (runtime.intermediate) narrows the fixed tree: drop --policy "
                                 "or --intermediate")
        self.policy = policy
        if policy is not None:
            policy.attach(self)
        if sampling_shape is not None and (self.chain is not None or self.tree_start_layer or self.stage is not None
                                           or policy is not None):
            raise SpecdraftError("a tree shape of its own at T > 0 is for the fixed tree verified from layer 0: not "
                                 "with a chain, a drafting policy, an intermediate model or --shallow-reuse-tree")
        self.most_tokens = max(max(s.depth for s in self.shapes), policy.max_depth() if policy is not None else 0) + 1
        self._reader = HostReader(self.most_tokens + 2, self.device)  # count, tokens, then a pruned tree's nodes
        self.sized = SizedVerify(self) if drafter is not None else None  # a pruned tree's cycles (sized_verify.py)
        self.verify_rows: Optional[int] = None  # the rows the verify of the cycle just queued runs

    def set_tree_scorer(self, scorer: Optional[TreeScorer]) -> None:
        """Draft with `scorer` from the next cycle on (None: unpruned); each scorer's cycles have graphs of their
        own (`scored_key`)."""
        self.tree_scorer = scorer

    def set_prune_options(self, prune_at: Optional[str] = None, prune_verify: Optional[str] = None) -> None:
        """Where the tree scorer drops candidates and what the verify holds, from the next cycle on (None: as
        before); each has graphs of its own (`scored_key`)."""
        self.prune_at, self.prune_verify = checked_prune_options(prune_at or self.prune_at,
                                                                  prune_verify or self.prune_verify)

    def scored_key(self, key: str) -> str:
        """The key of a graph whose body may run the tree scorer: one graph per scorer and place it prunes at (and
        one without)."""
        return key if self.tree_scorer is None else f"{key}:scorer{id(self.tree_scorer)}@{self.prune_at}"

    def set_exit_threshold(self, eta: float) -> None:
        """η for chains: stop drafting once the draft's top-1 probability falls below it (0: never)."""
        if not 0.0 <= eta < 1.0:
            raise SpecdraftError(f"the exit threshold must be in [0, 1), got {eta}")
        self.exit_threshold = eta
        if self.chain is not None:
            self.chain.set_exit_threshold(eta)

    def _set_chain_stop(self, rule: StopRule) -> None:
        """A chain's stop rule other than η (stop_rules.py); η must then be off."""
        if self.chain is None:
            raise SpecdraftError("a chain stop rule applies to chains; trees stop through a drafting policy")
        if self.exit_threshold > 0:
            raise SpecdraftError(f"the exit threshold {self.exit_threshold} and the {rule.name} stop rule both stop "
                                 f"chains: set the exit threshold to 0")
        self.chain.set_stop_rule(rule)

    # ---- pieces -------------------------------------------------------------------------------------------
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

    def prefill(self, prompt_ids: torch.Tensor, temperature: float, generator=None,
                prompt_embeds: Optional[torch.Tensor] = None, context: Optional[Mapping[str, torch.Tensor]] = None,
                prompt_rope: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                meanwhile: Optional[Callable[[], None]] = None) -> int:
        """prompt_ids [P] on the device: fills the caches, returns the first new token (prefill.py says how, and
        what `prompt_embeds`, `context`, `prompt_rope` and `meanwhile` are)."""
        return prefill(self, prompt_ids, temperature, generator, prompt_embeds, context, prompt_rope, meanwhile)

    def graph(self, key: str, fn, state: List[torch.Tensor], example: Sequence[torch.Tensor] = ()) -> CallGraph:
        """The engine's CUDA graph of fn under `key`, made at the first request (captured at its first call)."""
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = CallGraph(fn, state, example=example)
        return graph

    def graphed(self, key: str, fn, *args: torch.Tensor, extra_state: Sequence[torch.Tensor] = ()):
        """fn(*args), replayed from its graph under `key` when the engine uses graphs (state: `state_tensors` and
        `extra_state`, what else fn mutates)."""
        if not self.use_graphs:
            return fn(*args)
        return self.graph(key, fn, self.state_tensors() + list(extra_state), args)(*args)

    # ---- the cycle's phases -------------------------------------------------------------------------------
    def expansion(self, draws: Optional[DraftDraws] = None) -> TreeExpansion:
        """A tree expansion from the root (tree.py), with the tree scorer when there is one."""
        return TreeExpansion(self.drafter, self.shape, self.root, self.prefix_len, self.tree_start_layer > 0,
                             self.tree_scorer, draws, self.prune_at)

    def shape_at(self, temperature: float) -> TreeShape:
        """The fixed tree's shape at `temperature`: `sampling_shape` at T > 0 when there is one (and no tree
        scorer, whose pruned verify is sized by `shape`), else `shape`."""
        if temperature > 0 and self.sampling_shape is not None and self.tree_scorer is None:
            return self.sampling_shape
        return self.shape

    def build_tree(self, draws: Optional[DraftDraws] = None, shape: Optional[TreeShape] = None) -> DraftTree:
        """Draft this cycle's tree from the root (tree.py), of `shape` (default the engine's), pruned by the tree
        scorer when there is one; draws: its sampled drafts at T > 0. With an intermediate model, the chain it
        keeps of the tree (hierarchy.py)."""
        tree = build_tree(self.drafter, shape or self.shape, self.root, self.prefix_len, self.tree_start_layer > 0,
                          self.tree_scorer, draws, self.prune_at)
        return tree if self.stage is None else self.stage.narrow(tree, self.prefix_len)

    def verify_forward(self, tree: DraftTree, reuse: bool = True):
        """The tree's N nodes through the target, from the drafter's states when it kept them (and `reuse`) ->
        (logits [N, V], captured {i: [N, H]}, the last layer's states [N, H] before the final norm)."""
        if self.tree_start_layer and reuse:
            states = self.drafter.tree_verify_states(tree.candidate_ids)  # [N, H] entering the start layer
        else:
            states = self.target.embed(tree.tokens)  # [N, H]
        start_layer = self.tree_start_layer if reuse else 0
        hidden, captured = self.target.run_layers(states, self.prefix_len + tree.depths, self.prefix_len,
                                                  tree.tree_mask, start_layer, capture=self.capture)
        return self.target.logits(hidden), captured, hidden

    def commit(self, tree: DraftTree, captured, accepted_nodes, accept_length, bonus) -> CycleOutput:
        """Compact caches to the accepted path, hand it to the drafter, move the root. All on the device."""
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

    def use_judge(self, judge: Optional[NodeJudge]) -> None:
        """Accept by `judge` (at its threshold) in the cycles from now on, or exactly with None; every policy is made
        again (a judged policy's CUDA graphs are keyed by its threshold)."""
        self.judge = judge
        self._policies.clear()

    def acceptance(self, temperature: float) -> Acceptance:
        """The acceptance rule of this engine's cycles at `temperature` (accept.py), made once per temperature."""
        policy = self._policies.get(temperature)
        if policy is None:  # checked once a temperature, not every cycle
            if self.stage is not None and temperature > 0:
                raise SpecdraftError(f"hierarchical drafting (runtime.intermediate) decodes greedily; got temperature "
                                     f"{temperature}: use 0, or leave the intermediate model out")
            policy = self._policies[temperature] = acceptance_for(temperature, self.judge)
        return policy

    def accept_and_commit(self, policy: Acceptance, tree: DraftTree, verified, randomness=None,
                          depth_limit: Optional[int] = None) -> CycleOutput:
        """verified = verify_forward's (logits, captured, hidden) -> the policy's accepted path (at most
        `depth_limit` drafted nodes, default the shape's depth), committed."""
        logits, captured, hidden = verified
        depth_limit = self.shape.depth if depth_limit is None else depth_limit
        accepted_nodes, accept_length, bonus = policy.accept(logits, tree, depth_limit, randomness, hidden)
        out = self.commit(tree, captured, accepted_nodes, accept_length, bonus)
        if self.trace_target_choices:
            out.target_next = logits.argmax(-1)  # [N]: what the target itself would emit after each node
        if self.tree_scorer is not None:  # the host reads how many nodes the pruned tree verified, at a fixed place
            room = self.most_tokens + 1 - out.for_host.shape[0]  # a policy's cycles emit up to most_tokens
            padded = torch.nn.functional.pad(out.for_host, (0, room))  # [most_tokens + 1]
            out.for_host = torch.cat([padded, tree.valid.sum(0, keepdim=True)])
        return out

    def drafted_count(self, nodes: int) -> Optional[int]:
        """The drafted tokens a tree cycle of `nodes` nodes verifies; None where the host reads them from the
        cycle's output (a pruned tree's, `accept_and_commit`)."""
        return None if self.tree_scorer is not None else nodes - 1

    def draws(self, policy: Acceptance, noise: Optional[torch.Tensor]) -> Optional[DraftDraws]:
        """The sampled drafts' draws of a cycle under `policy` from its noise (None: point-mass drafts)."""
        return None if noise is None else DraftDraws(policy.temperature, noise)

    def draft_noise(self, policy: Acceptance, rows: int, generator) -> Optional[torch.Tensor]:
        """Exp(1) noise [rows, Vd] for a cycle's sampled drafts (drawn outside any graph), or None when the cycle
        drafts point masses (T = 0, or sample_drafts off)."""
        if not (self.sample_drafts and policy.temperature > 0):
            return None
        return draw_exponential(rows, self.drafter.d2t.shape[0], generator, self.device)

    def cycle_args(self, policy: Acceptance, nodes: int, generator,
                   shape: Optional[TreeShape] = None) -> Tuple[torch.Tensor, ...]:
        """The random inputs of a tree cycle of `shape` (default the engine's) under `policy` verifying `nodes`
        nodes: (uniforms[, Exp(1) noise of each expanded node, when its drafts are sampled]), or () at T = 0."""
        randomness = policy.randomness(nodes, generator, self.device)
        if randomness is None:
            return ()
        noise = self.draft_noise(policy, (shape or self.shape).expanded_rows, generator)
        return (randomness,) if noise is None else (randomness, noise)

    def _tree_cycle_body(self, policy: Acceptance, shape: TreeShape, randomness: Optional[torch.Tensor] = None,
                         noise: Optional[torch.Tensor] = None) -> CycleOutput:
        tree = self.build_tree(self.draws(policy, noise), shape)
        return self.accept_and_commit(policy, tree, self.verify_forward(tree), randomness, shape.depth)

    def sizes_verify(self) -> bool:
        """Whether a tree cycle verifies only the candidates its scorer keeps (module docstring): a scorer, and
        prune_verify "kept", on a tree verified from layer 0 and not narrowed by an intermediate model."""
        return (self.tree_scorer is not None and self.prune_verify == "kept" and self.chain is None
                and not self.tree_start_layer and self.stage is None)

    def cycle(self, temperature: float, generator) -> Tuple[CycleOutput, Optional[int]]:
        """One cycle -> (its output, the drafted tokens it verified; None where the host reads them from the
        output: a pruned tree's): the drafting policy's when there is one."""
        if self.policy is not None:
            return self.policy.cycle(temperature, generator)
        return self.base_cycle(temperature, generator)

    def base_cycle(self, temperature: float, generator) -> Tuple[CycleOutput, Optional[int]]:
        """One cycle of the engine's own shape (the fixed tree, or the chain with its exits)."""
        policy = self.acceptance(temperature)
        if self.chain is not None:
            max_depth = None
            if self.dynamic_exit is not None:
                self.exit_index, max_depth = self.dynamic_exit.choose()
                if self.drafter.caps.exit_layers:
                    self.drafter.select_exit(self.exit_index)
            return self.chain.cycle(policy, generator, max_depth)
        if self.sizes_verify():
            out, drafted, self.verify_rows = self.sized.cycle(policy, generator)
            return out, drafted
        return self.tree_cycle(policy, self.shape_at(temperature), generator)

    def tree_cycle(self, policy: Acceptance, shape: TreeShape, generator) -> Tuple[CycleOutput, Optional[int]]:
        """One cycle of the fixed tree of `shape` under `policy`, in a CUDA graph of its own -> (its output, the
        drafted tokens it verified)."""
        self.verify_rows = shape.budget if self.stage is None else shape.depth + 1
        args = self.cycle_args(policy, shape.budget, generator, shape)
        return self.graphed(self._tree_cycle_key(policy, shape), partial(self._tree_cycle_body, policy, shape),
                            *args), self.drafted_count(shape.budget)

    def ready_tree_cycles(self, policy: Acceptance, shapes: Iterable[TreeShape]) -> None:
        """The graph of each shape's `tree_cycle` under `policy` captured now (the state left as it was), so that a
        drafting policy that switches shapes never captures one in the middle of a timed generation."""
        if not self.use_graphs:
            return
        examples = torch.Generator(device=self.device).manual_seed(0)  # example draws: the caller's stream untouched
        for shape in shapes:
            body = partial(self._tree_cycle_body, policy, shape)
            self.graph(self._tree_cycle_key(policy, shape), body, self.state_tensors(),
                       self.cycle_args(policy, shape.budget, examples, shape)).ready()

    def _tree_cycle_key(self, policy: Acceptance, shape: TreeShape) -> str:
        return self.scored_key(f"cycle:{policy.key}:{shape.depth},{shape.topk},{shape.budget}")

    def state_tensors(self) -> List[torch.Tensor]:
        """Tensors a captured cycle mutates, saved and restored around its warm-up runs."""
        tensors = [self.prefix_len, self.root, self.target.k_cache, self.target.v_cache]
        tensors += self.stage.state_tensors() if self.stage is not None else []
        return tensors + (self.drafter.state_tensors() if self.drafter is not None else [])

    # ---- loops --------------------------------------------------------------------------------------------
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
        begin = partial(self.policy.begin, list(prompt_ids)) if self.policy is not None else None
        generated = [self.prefill(prompt, temperature, generator, prompt_embeds, context, prompt_rope,
                                  meanwhile=begin)]
        result = GenerationResult(tokens=generated)
        if self.dynamic_exit is not None:
            self.dynamic_exit.reset()
        if self.policy is not None:
            self.policy.observe(generated)
        done = finished(generated, generated, eos_ids, max_new_tokens)
        host_driven = self.dynamic_exit is not None or (self.policy is not None and self.policy.reads_every_cycle)
        ahead = 1 if self.overlap and not trace and not host_driven else 0  # cycles queued past the read
        most_per_cycle = self.most_tokens  # every draft accepted, then the bonus token
        read = self.most_tokens + 1 + (self.tree_scorer is not None)  # + a pruned tree's valid nodes
        queued = deque()
        while not done:
            may_end = len(generated) + most_per_cycle * len(queued) >= max_new_tokens  # by the cycles in flight
            if not (queued and may_end):  # else read them first: no cycle runs past the last token asked for
                self.verify_rows = None
                out, drafted = self.cycle(temperature, generator)
                queued.append((self._reader.stage(out.for_host), drafted, self.exit_index, self.verify_rows, out))
                if len(queued) <= ahead:
                    continue
            slot, drafted, exit_index, verify_rows, out = queued.popleft()
            host = self._reader.read(slot, read)  # the one host wait of a cycle
            new_tokens = host[1:1 + host[0]]
            drafted = host[-1] - 1 if drafted is None else drafted  # a pruned tree's valid nodes, less the root
            generated += new_tokens
            if self.policy is not None:
                self.policy.observe(new_tokens)
            done = finished(generated, new_tokens, eos_ids, max_new_tokens)
            result.accepted.append(host[0] - 1)
            result.drafted.append(drafted)
            result.exits.append(exit_index)
            result.verify_rows.append(verify_rows)
            if self.dynamic_exit is not None:
                self.dynamic_exit.update(exit_index, drafted, host[0] - 1)
            if trace:
                result.trace.append(trace_row(out))
        result.tokens = cut_answer(generated, eos_ids, max_new_tokens)
        self._sync()
        result.seconds = time.perf_counter() - started
        return result

    def plain_step(self, token: torch.Tensor) -> torch.Tensor:
        """token [1] at position prefix_len -> its target logits [1, V]; advances the prefix."""
        hidden, _ = self.target.run_layers(self.target.embed(token), self.prefix_len, self.prefix_len,
                                           self._one_mask)
        self.prefix_len.add_(1)
        return self.target.logits(hidden)

    def plain_stepper(self, token: torch.Tensor):
        """`plain_step` as decoding runs it: its CUDA graph (captured at the first call) when the engine uses
        graphs. token [1]: an example of its argument."""
        if not self.use_graphs:
            return self.plain_step
        return self.graph("plain", self.plain_step, [self.prefix_len, self.target.k_cache, self.target.v_cache],
                          (token,))

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
