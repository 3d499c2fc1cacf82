"""Chain cycles with a confidence exit and shallow-state reuse (Kangaroo's double early exit, arXiv:2404.18911).

Drafting: the drafter proposes one token per depth (its top-1). With an exit threshold η > 0 the cycle reads
the draft's top-1 probability after every depth (one host read of one bool) and stops once it falls below η (or
where another stop rule says so, stop_rules.py; the svip and ddd policies give theirs): that token is not
drafted, and the cycle verifies only the k' tokens drafted before it (k' = 0 verifies the root alone, a plain
decoding step). A dynamic exit (policies/dynamic_exit.py) caps the depth per cycle as well. Both save draft steps
and verify rows; any drafter can use them, the cycle never asks which method it runs. With a tree scorer
(core/drafting.py) the chain ends, the same way, at the first token the scorer drops (each token the one child of
its parent: its log-probability, the chain's joint log-probability before it, the logits it was drawn from, its
depth).

Verification: the chain's k'+1 nodes (root and drafts) in one target pass with causal attention. If the drafter
has `verify_start_layer` ℓ (drafter.py), the pass starts at layer ℓ from the states the drafter computed
while drafting (`chain_verify_states`): layers 0..ℓ-1 never rerun, except for the one node no draft step read.

CUDA graphs (GPU): one graph for `first`, one per draft depth d (`step(d)`), one verify per (k', computed)
(k' = 0..K; `computed` is how many chain nodes went through the drafter, k' or k'+1): at most 3K + 2 graphs,
each replayed from static buffers (and each per drafter `variant`, when a drafter holds several drafts).
Without exits (η = 0, no tree scorer, no dynamic exit) the whole cycle is one graph, as a tree's is. At T > 0
the verify's rejection sampling runs on the device too (sampling.py), from uniforms drawn before the graph replays.
"""
from __future__ import annotations

from functools import partial
from typing import List, Optional, Tuple

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.kernels.draft_topk import draft_topk
from specdraft.kernels.sampled_topk import sampled_topk
from specdraft.decoding.accept import Acceptance
from specdraft.decoding.cycles.base import CycleKind, CycleRun
from specdraft.decoding.cycles.context import CycleContext, Verified
from specdraft.decoding.host_reader import HostReader
from specdraft.decoding.policies.dynamic_exit import DynamicExit
from specdraft.decoding.sampled_drafts import SampledDrafts
from specdraft.decoding.stop_rules import ConfidenceStop, StopRule
from specdraft.decoding.tree import DraftTree


class ChainCycle(CycleKind):
    """Chains of up to `depth` drafts (module docstring). `reuse_shallow`: verify from the drafter's
    verify_start_layer when it declares shallow layers; `length_choice`: a dynamic exit that chooses each cycle's
    exit and length (None: every cycle drafts `depth`)."""

    def __init__(self, context: CycleContext, depth: int, reuse_shallow: bool = True,
                 length_choice: Optional[DynamicExit] = None):
        self.context, self.depth, self.length_choice = context, depth, length_choice
        drafter, device = context.drafter, context.device
        self.most_tokens = depth + 1
        self.reads_every_cycle = length_choice is not None  # its choice reads every cycle before the next
        self.start_layer = drafter.verify_start_layer if reuse_shallow and drafter.caps.shallow_layers else 0
        if self.start_layer and min(context.capture, default=self.start_layer) < self.start_layer:
            raise SpecdraftError(f"the drafter's verify_start_layer {self.start_layer} is above the feature "
                                 f"layers {context.capture} it reads; the verify could not capture them")
        self.tokens = torch.zeros(depth + 1, dtype=torch.long, device=device)  # [K+1] root, then drafts
        self.logprobs = torch.zeros(depth + 1, device=device)  # [K+1] each draft's top-1 log-probability
        self.stops = torch.zeros(depth + 1, dtype=torch.long, device=device)  # [K+1] 1: stop before draft d
        self.flags = HostReader(1, device)  # the stop reads, one depth behind the drafting (`draft`)
        self.stop_rule: Optional[StopRule] = None
        self.exit_threshold = 0.0
        self.temperature = 0.0  # > 0: this cycle's drafts are sampled (sampled_drafts.py)
        vocab = context.d2t.shape[0]
        self.noise = torch.zeros(depth, vocab, device=device) if context.sample_drafts else None  # [K, Vd] Exp(1)
        self.draft_logprobs = torch.zeros(depth + 1, vocab, device=device) if context.sample_drafts else None
        index = torch.arange(depth + 1, device=device)
        self.depths = index  # [K+1] chain node j is at depth j
        self.parents = index - 1  # [K+1]
        self.causal = index[:, None] >= index[None, :]  # [K+1, K+1]
        self.is_draft = index > 0  # [K+1] every node but the root (each sampled, at T > 0)
        self.slots = [index[d:d + 1] for d in range(depth + 1)]  # scratch slot of depth d, [1] each
        self.visible = [(index <= d)[None] for d in range(depth + 1)]  # [1, W] scratch slots 0..d

    def set_exit_threshold(self, eta: float) -> None:
        """η in [0, 1): stop drafting once the draft's top-1 probability falls below it (0: never)."""
        self.exit_threshold = eta
        self.stop_rule = ConfidenceStop(eta) if eta > 0 else None

    def set_stop_rule(self, rule: Optional[StopRule]) -> None:
        """Stop drafting when `rule` says so (stop_rules.py; None: draft every depth); η must then be off."""
        if rule is not None and self.exit_threshold > 0:
            raise SpecdraftError(f"the exit threshold {self.exit_threshold} and the {rule.name} stop rule both stop "
                                 f"chains: set the exit threshold to 0")
        self.stop_rule = rule

    @property
    def exits(self) -> bool:
        """Whether drafting may stop early: a stop rule (η's among them) or a tree scorer (`draft` reads `stops`)."""
        return self.stop_rule is not None or self.context.scorer is not None

    # ---- device work (graph bodies) ---------------------------------------------------------------------
    def _record(self, depth: int, logits: torch.Tensor) -> None:
        """logits [1, Vd] of depth `depth` -> tokens[depth], logprobs[depth] (the top-1 log-probability; sampled
        drafts: the token sampled, its log q kept for the verify), and stops[depth] where a stop rule reads it."""
        d2t = self.context.d2t
        if self.temperature > 0:  # a stop rule reads the top-1 log-probability, never the sampled token's
            noise = self.noise[depth - 1:depth]  # [1, Vd]
            _, ids, logprobs = sampled_topk(logits, d2t, 1, noise, self.temperature,
                                            self.draft_logprobs[depth - 1:depth])  # [1, 1], [1, Vd] in place
            scores = logprobs.amax(dim=-1, keepdim=True)  # [1, 1]
        else:
            scores, ids = draft_topk(logits, d2t, 1)  # [1, 1]
        self.tokens[depth:depth + 1].copy_(ids[0])
        self.logprobs[depth:depth + 1].copy_(scores[0])
        if self.exits:  # `draft` reads it; graphs are keyed by the rule and the scorer (`_run`)
            self.stops[depth:depth + 1].copy_(self._stops(depth, logits, scores[0]))

    def _stops(self, depth: int, logits: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        """Whether the token of `depth` (top-1 log-probability score [1], drawn from logits [1, Vd]) ends the
        chain -> [1] bool: the stop rule says so, or the tree scorer drops it (its joint: the chain's top-1
        log-probabilities up to it, which never read a sampled token)."""
        path = self.logprobs[1:depth + 1]  # [depth]
        stop = self.stop_rule.chain(logits, score, path) if self.stop_rule is not None else torch.zeros_like(
            score, dtype=torch.bool)
        scorer = self.context.scorer
        if scorer is not None:  # the token is the one child of its parent, the chain before it
            kept = scorer.prune(score.view(1, 1), path[:-1].sum(0, keepdim=True), logits, depth)  # [1, 1]
            stop = stop | (kept[0] == float("-inf"))
        return stop

    def _first(self) -> torch.Tensor:
        context = self.context
        self.tokens[:1].copy_(context.root)
        logits, hidden = context.drafter.first(context.root, context.prefix_len)  # [1, Vd], [1, Hd]
        self._record(1, logits)
        return hidden

    def _step(self, depth: int, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [1, Hd]: the output at depth-1 -> the output at depth; proposes the token of depth+1."""
        context = self.context
        positions = context.prefix_len + depth  # [1]
        logits, hidden = context.drafter.step(depth, hidden, self.tokens[depth:depth + 1], positions,
                                              self.slots[depth], self.visible[depth])
        self._record(depth + 1, logits)
        return hidden

    def verify_forward(self, drafted: int, computed: int) -> Tuple[DraftTree, Verified]:
        """The chain's drafted+1 nodes through the target -> (tree, the target's pass over it)."""
        context, n = self.context, drafted + 1
        tokens, positions = self.tokens[:n], context.prefix_len + self.depths[:n]  # [n]
        mask = self.causal[:n, :n]
        if self.start_layer:
            states = context.drafter.chain_verify_states(tokens, positions, computed)  # [n, H] entering ℓ
        else:
            states = context.target.embed(tokens)
        hidden, captured = context.target.run_layers(states, positions, context.prefix_len, mask, self.start_layer,
                                                     capture=context.capture)
        tree = DraftTree(tokens=tokens, parents=self.parents[:n], depths=self.depths[:n],
                         valid=torch.ones_like(tokens, dtype=torch.bool), tree_mask=mask,
                         joint_logprobs=torch.cumsum(self.logprobs[:n], 0),  # logprobs[0] (root) stays 0
                         sampled=self._sampled_drafts(n))
        return tree, Verified(context.target.logits(hidden), captured, hidden)

    def _sampled_drafts(self, n: int) -> Optional[SampledDrafts]:
        """With sampled drafts: node j's children came from row j of draft_logprobs; every draft was sampled."""
        if self.temperature <= 0:
            return None
        return SampledDrafts(rows=self.depths[:n], logprobs=self.draft_logprobs, d2t=self.context.d2t,
                             sampled=self.is_draft[:n])

    def _verify(self, acceptance: Acceptance, randomness=None, *, drafted: int, computed: int):
        """randomness: the acceptance's draws for drafted + 1 nodes, made outside any graph."""
        tree, verified = self.verify_forward(drafted, computed)
        return self.context.accept_and_commit(acceptance, tree, verified, self.depth, randomness)

    def draft_all(self) -> None:
        hidden = self._first()
        for d in range(1, self.depth):
            hidden = self._step(d, hidden)

    def _whole(self, acceptance: Acceptance, randomness=None):
        """No exits: K drafts and their verify, one graph on GPU."""
        self.draft_all()
        return self._verify(acceptance, randomness, drafted=self.depth, computed=self.depth)

    # ---- host loop ------------------------------------------------------------------------------------
    def _run(self, key: Tuple, fn, *args):
        """fn(*args), replayed from a CUDA graph per key, drafter variant (dynamic_exit.ExitChoice's draft), stop
        rule and tree scorer (`_record` evaluates them) and sampling temperature (sampled drafts)."""
        context = self.context
        if not context.graphs.use_graphs:
            return fn(*args)
        rule = self.stop_rule
        key = ("chain",) + key + ((rule.name, rule.threshold) if rule is not None else None, context.scored_key(""),
                                  self.temperature, context.drafter.variant)
        return context.graphs.get(key, fn, lambda: context.state_tensors() + self.state(), args)(*args)

    def state(self) -> List[torch.Tensor]:
        """The chain's own tensors a captured cycle mutates (besides the context's `state_tensors`)."""
        return [self.tokens, self.logprobs, self.stops] + ([self.draft_logprobs] if self.temperature > 0 else [])

    def draft(self, max_depth: int) -> Tuple[int, int]:
        """Draft up to max_depth tokens, stopping at an exit (the stop rule, the tree scorer) -> (drafted k', chain
        nodes computed that the verify may reuse: k' or k' + 1). The host reads each depth's stop flag one depth
        behind: the next draft step is queued before the read, so the device never waits for the host (a stop
        wastes that one step)."""
        check = self.exits
        hidden, calls, drafted = self._run(("first",), self._first), 1, 0
        pending = self.flags.stage(self.stops[1:2]) if check else None
        for depth in range(1, max_depth + 1):
            if depth < max_depth:  # queued before the read of this depth's flag
                hidden = self._run(("step", depth), partial(self._step, depth), hidden)
                calls += 1
            following = self.flags.stage(self.stops[depth + 1:depth + 2]) if check and depth < max_depth else None
            if check and self.flags.read(pending, 1)[0]:  # the one host read of a depth
                break
            drafted, pending = depth, following
        return drafted, min(calls, drafted + 1)

    def run(self, acceptance: Acceptance, generator) -> CycleRun:
        """One cycle: the dynamic exit's choice of exit and length (when there is one), then `cycle`."""
        exit_index, max_depth = 0, self.depth
        if self.length_choice is not None:
            exit_index, max_depth = self.length_choice.choose()
            if self.context.drafter.caps.exit_layers:
                self.context.drafter.select_exit(exit_index)
        out, drafted = self.cycle(acceptance, generator, max_depth)
        return CycleRun(out, drafted, None, exit_index)

    def cycle(self, acceptance: Acceptance, generator, max_depth: Optional[int] = None):
        """One cycle of at most `max_depth` drafts (default the chain's depth) -> (CycleOutput, drafted k')."""
        depth, context = self.depth, self.context
        max_depth = depth if max_depth is None else max_depth
        noise = context.draft_noise(acceptance, depth, generator)  # [K, Vd], before the drafting reads it
        self.temperature = acceptance.temperature if noise is not None else 0.0
        if noise is not None:
            self.noise.copy_(noise)
        if not self.exits and max_depth == depth:
            return self._acceptance_run(("whole",), self._whole, acceptance, depth + 1, generator), depth
        drafted, computed = self.draft(max_depth)
        return self._acceptance_run(("verify", drafted, computed), partial(self._verify, drafted=drafted,
                                                                            computed=computed),
                                    acceptance, drafted + 1, generator), drafted

    def _acceptance_run(self, key: Tuple, fn, acceptance: Acceptance, nodes: int, generator):
        """fn(acceptance[, randomness]) under its graph key, the acceptance's draws for `nodes` nodes made first."""
        randomness = acceptance.randomness(nodes, generator, self.context.device)
        args = () if randomness is None else (randomness,)
        return self._run(key + (acceptance.key,), partial(fn, acceptance), *args)

    def begin(self) -> None:
        if self.length_choice is not None:
            self.length_choice.reset()

    def observe(self, run: CycleRun, accepted: int) -> None:
        if self.length_choice is not None:
            self.length_choice.update(run.exit_index, run.drafted, accepted)
