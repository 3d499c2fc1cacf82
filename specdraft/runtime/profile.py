"""Where one draft-verify cycle spends its time: draft (tree building), verify (the target's pass) and
bookkeeping (acceptance, cache compaction, handing the accepted path to the drafter), timed eagerly phase by
phase with a device sync between phases; plus the whole cycle and one plain decoding step as the engine runs them
(one CUDA graph each on GPU), replayed back to back: `*_ms` is the time per call to the last one's end, `*_host_ms`
the host's time to issue one. Where the host's time nears the whole, the loop is bound by issuing work (a graph's
launch), not by the device; where a decoding loop reads far slower than its step's `*_ms`, the time goes between
steps (sampling, reading the token back)."""
from __future__ import annotations

import time
from typing import Dict, List

import torch

from specdraft.kernels.tree_verify import verify_greedy


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _draft(engine):
    """One cycle's drafting -> what `_verify` takes; a chain drafts as the engine's chain cycles do (exits)."""
    if engine.chain is not None:
        return engine.chain.draft(engine.shape.depth)  # (drafted, computed)
    return engine._build_tree()


def _verify(engine, drafted):
    """The target's pass over what `_draft` drafted -> (logits [N, V], captured, tree); it starts at the
    drafter's verify_start_layer when the engine reuses the shallow states."""
    if engine.chain is not None:
        return engine.chain._verify_forward(*drafted)
    tree = drafted
    logits, captured = engine._verify_forward(tree)
    return logits, captured, tree


@torch.no_grad()
def profile_cycles(runtime, prompt: List[int], cycles: int = 16) -> Dict:
    engine = runtime.engine
    device, shape = engine.device, engine.shape
    totals = {"draft": 0.0, "verify": 0.0, "bookkeeping": 0.0}
    engine.prefill(torch.tensor(prompt, device=device), 0.0)
    use_graphs, engine.use_graphs = engine.use_graphs, False  # phase by phase, eagerly
    for _ in range(cycles):
        started = _clock(device)
        drafted = _draft(engine)
        draft_done = _clock(device)
        logits, captured, tree = _verify(engine, drafted)
        verified = _clock(device)
        match_tokens = torch.where(tree.valid, tree.tokens, -1)
        nodes, length, bonus = verify_greedy(logits, match_tokens, tree.parents, shape.depth)
        engine._commit(tree, captured, nodes, length, bonus)
        done = _clock(device)
        totals["draft"] += draft_done - started
        totals["verify"] += verified - draft_done
        totals["bookkeeping"] += done - verified
    engine.use_graphs = use_graphs
    cycle_ms, cycle_host_ms = _replayed(engine, prompt, lambda: engine._cycle(0.0, None), cycles)
    token = engine.root.clone()
    step = engine.plain_stepper(token)
    plain_ms, plain_host_ms = _replayed(engine, prompt, lambda: step(token), cycles)
    return {"eager_ms": {k: 1000 * v / cycles for k, v in totals.items()}, "cycle_ms": cycle_ms,
            "cycle_host_ms": cycle_host_ms, "plain_step_ms": plain_ms, "plain_host_ms": plain_host_ms,
            "cycles": cycles, "cuda_graphs": engine.use_graphs}


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
