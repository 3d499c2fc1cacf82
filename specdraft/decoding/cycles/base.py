"""The cycle-kind interface: what a kind of draft-verify cycle implements so that `SpecEngine` can run it.

A cycle kind is one module under decoding/cycles/ holding a class derived from `CycleKind`. It is built with the
engine's `CycleContext` (cycles/context.py: the target, the drafter, the cache state `prefix_len` and `root`, the
graph cache, the tree scorer, the shared steps) and whatever it needs of its own (a shape, a stop rule), and never
sees the engine. Each cycle:

    run(acceptance, generator) -> CycleRun
        Draft from `context.root` at `context.prefix_len`, verify in one target pass, accept by `acceptance`
        (accept.py: greedy, rejection sampling, a judge) and commit, all on the device: `context.verify`,
        `context.accept_and_commit` (which compacts the caches, hands the accepted path to the drafter and moves
        the root) do the shared part. Random inputs are drawn from `generator` before any graph replays
        (`acceptance.randomness`, `context.draft_noise`) and passed in as tensors; each device part runs through
        `context.graphed(key, fn, *tensors)` (one CUDA graph per key on a GPU: static shapes, no host read inside
        it; a key names everything the body's work depends on: the kind, its shape, `acceptance.key`, and the
        tree scorer through `context.scored_key`). The output's `for_host` is what the host reads of the cycle,
        laid out by `accept_and_commit`.

Optional, with defaults here:
    most_tokens             the most tokens one cycle emits (its deepest drafted path + the bonus token)
    reads_every_cycle       True when the host must read this cycle before the engine queues the next (it reads
                            the device inside its cycle, or chooses the next from this one's tokens)
    ready(acceptance)       capture its graphs now (so that none is captured inside a timed generation)
    begin()                 a new generation starts
    observe(run, accepted)  the host has read one of its cycles: `accepted` drafted tokens were accepted

The engine picks a kind per cycle (its own: `EngineOptions.cycle_kind` when the caller gives one, else
`BlockCycle` for a drafter declaring `DrafterCaps.block_size`, else its shape's chain or tree; or the drafting
policy's choice, decoding/policies/) and runs it. The block drafter's kind (block.py: one drafter pass proposing B
positions, verified as a chain or a static-shape tree) shows the pattern: its `run` calls the drafter, builds the
`DraftTree` of its proposals (tree.py's DraftTree: tokens, parents, depths, valid, tree_mask, joint_logprobs; ids
through `kernels.draft_topk` and `context.d2t`, so that a broken draft names no token outside the target's
vocabulary), then `context.verify` and `context.accept_and_commit(acceptance, tree, verified, depth_limit,
randomness)` (tests/runtime/test_engine.py runs a kind of one draft written against this interface alone).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from specdraft.decoding.accept import Acceptance
from specdraft.decoding.outputs import CycleOutput


@dataclass
class CycleRun:
    """One cycle as queued on the device: its output and what the host records of it."""

    output: CycleOutput
    drafted: Optional[int]
    """Drafted tokens the cycle verified; None where the host reads them from the output (a pruned tree's)."""
    verify_rows: Optional[int] = None
    """Rows the verify ran, padding included (a tree's; None for a chain's or a policy's own cycles)."""
    exit_index: int = 0
    """The drafter's exit the cycle drafted at (a dynamic exit's choice, policies/dynamic_exit.py)."""


class CycleKind:
    """One kind of draft-verify cycle (module docstring: the interface)."""

    most_tokens: int = 1
    reads_every_cycle: bool = False

    def run(self, acceptance: Acceptance, generator) -> CycleRun:
        raise NotImplementedError

    def ready(self, acceptance: Acceptance) -> None:
        """Capture this kind's graphs under `acceptance` now (none by default: each is captured at its first run)."""

    def begin(self) -> None:
        """A new generation starts."""

    def observe(self, run: CycleRun, accepted: int) -> None:
        """The host has read `run` (one of this kind's cycles): `accepted` of its drafted tokens were accepted."""
