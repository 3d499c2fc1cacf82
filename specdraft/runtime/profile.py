"""Where one draft-verify cycle spends its time: draft (tree building), verify (the target's pass) and
bookkeeping (acceptance, cache compaction, handing the accepted path to the drafter), timed eagerly phase by
phase with a device sync between phases; plus the whole cycle and one plain decoding step as the engine runs them
(one CUDA graph each on GPU), replayed back to back: `*_ms` is the time per call to the last one's end, `*_host_ms`
the host's time to issue one. Where the host's time nears the whole, the loop is bound by issuing work (a graph's
launch), not by the device; where a decoding loop reads far slower than its step's `*_ms`, the time goes between
steps (sampling, reading the token back). The eager phases add up to `eager_cycle_ms`, their own cycle; `cycle_ms`
is another measurement of the same cycle without the syncs between phases (and in one CUDA graph on a GPU), so
the two differ by what the syncs cost and, on a busy CPU, by the load."""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional

import torch

logger = logging.getLogger(__name__)


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def draft_phase(engine, draws=None):
    """One cycle's drafting -> what `verify_phase` takes; a chain drafts as the engine's chain cycles do (exits, and
    the sampled drafts its cycle set up); a tree samples its drafts from `draws` (None: point masses)."""
    if engine.chain is not None:
        return engine.chain.draft(engine.shape.depth)  # (drafted, computed)
    return engine.build_tree(draws)


def verify_phase(engine, drafted):
    """The target's pass over what `draft_phase` drafted -> (tree, (logits [N, V], captured, last states)); it starts
    at the drafter's verify_start_layer when the engine reuses the shallow states."""
    if engine.chain is not None:
        return engine.chain.verify_forward(*drafted)
    return drafted, engine.verify_forward(drafted)


@torch.no_grad()
def profile_cycles(runtime, prompt: List[int], cycles: int = 16) -> Dict:
    engine = runtime.engine
    device = engine.device
    totals = {"draft": 0.0, "verify": 0.0, "bookkeeping": 0.0}
    greedy = engine.acceptance(0.0)
    engine.prefill(torch.tensor(prompt, device=device), 0.0)
    use_graphs, engine.use_graphs = engine.use_graphs, False  # phase by phase, eagerly
    for _ in range(cycles):
        started = _clock(device)
        drafted = draft_phase(engine)
        draft_done = _clock(device)
        tree, verified = verify_phase(engine, drafted)
        verify_done = _clock(device)
        engine.accept_and_commit(greedy, tree, verified)
        done = _clock(device)
        totals["draft"] += draft_done - started
        totals["verify"] += verify_done - draft_done
        totals["bookkeeping"] += done - verify_done
    engine.use_graphs = use_graphs
    cycle_ms, cycle_host_ms = _replayed(engine, prompt, lambda: engine.cycle(0.0, None), cycles)
    token = engine.root.clone()
    step = engine.plain_stepper(token)
    plain_ms, plain_host_ms = _replayed(engine, prompt, lambda: step(token), cycles)
    eager_ms = {k: 1000 * v / cycles for k, v in totals.items()}
    return {"eager_ms": eager_ms, "eager_cycle_ms": sum(eager_ms.values()), "cycle_ms": cycle_ms,
            "cycle_host_ms": cycle_host_ms, "plain_step_ms": plain_ms, "plain_host_ms": plain_host_ms,
            "graph_split_ms": _graph_split_or_none(engine, prompt, cycles) if engine.use_graphs else None,
            "cycles": cycles, "cuda_graphs": engine.use_graphs}


def cycle_phases(engine):
    """The greedy cycle (no exits) as three functions of nothing, each reading what the one before left in
    `handoff` -> [(phase, fn)]. Captured one graph each, the last capture leaves the graphs' static tensors there."""
    handoff, chain, depth, greedy = {}, engine.chain, engine.shape.depth, engine.acceptance(0.0)

    def draft():
        handoff["tree"] = chain.draft_all() if chain is not None else engine.build_tree()

    def verify():
        if chain is not None:
            handoff["tree"], handoff["verified"] = chain.verify_forward(depth, depth)
        else:
            handoff["verified"] = engine.verify_forward(handoff["tree"])

    def bookkeeping():
        return engine.accept_and_commit(greedy, handoff["tree"], handoff["verified"])

    return [("draft", draft), ("verify", verify), ("bookkeeping", bookkeeping)]


def _graph_split_or_none(engine, prompt: List[int], cycles: int) -> Optional[Dict[str, float]]:
    """`_graph_split`, or None with a warning where a phase will not capture alone (the split is a diagnosis:
    it must not cost the bench its other figures)."""
    try:
        return _graph_split(engine, prompt, cycles)
    except RuntimeError as error:
        logger.warning("cycle split by phase graphs skipped: %s", str(error).splitlines()[0])
        return None


def _graph_split(engine, prompt: List[int], cycles: int) -> Dict[str, float]:
    """Each phase in its own CUDA graph, the three replayed in order `cycles` times with events between them ->
    the device's ms per phase (a graph's launch gap included: they sum to a little over `cycle_ms`)."""
    state = engine.state_tensors() + (engine.chain.state() if engine.chain is not None else [])
    graphs = [(name, engine.graph(engine.scored_key(f"phase:{name}"), fn, state)) for name, fn in cycle_phases(engine)]
    engine.prefill(torch.tensor(prompt, device=engine.device), 0.0)
    for _, graph in graphs:  # captured in order: each one's warm-up reads the outputs of the one before
        graph()
    engine.prefill(torch.tensor(prompt, device=engine.device), 0.0)
    marks = [[torch.cuda.Event(enable_timing=True) for _ in range(len(graphs) + 1)] for _ in range(cycles)]
    for events in marks:
        events[0].record()
        for (_, graph), event in zip(graphs, events[1:]):
            graph()
            event.record()
    torch.cuda.synchronize(engine.device)
    return {name: sum(events[i].elapsed_time(events[i + 1]) for events in marks) / cycles
            for i, (name, _) in enumerate(graphs)}


def _replayed(engine, prompt: List[int], call, repeats: int):
    """call() `repeats` times back to back after a prefill of `prompt` and one untimed call (a graph's capture)
    -> (ms per call to the device's end, ms the host took to issue each)."""
    device = engine.device
    engine.prefill(torch.tensor(prompt, device=device), 0.0)
    call()
    started = _clock(device)
    for _ in range(repeats):
        call()
    issued = time.perf_counter()
    done = _clock(device)
    return 1000 * (done - started) / repeats, 1000 * (issued - started) / repeats
