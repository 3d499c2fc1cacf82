"""Where one draft-verify cycle spends its time: draft (tree building), verify (the target's pass) and
bookkeeping (acceptance, cache compaction, handing the accepted path to the drafter), timed eagerly phase by
phase with a device sync between phases; plus the whole cycle as the engine runs it (one CUDA graph on GPU)."""
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
    engine.prefill(torch.tensor(prompt, device=device), 0.0)
    engine._cycle(0.0, None)  # captures the graph if the engine uses one
    started = _clock(device)
    for _ in range(cycles):
        engine._cycle(0.0, None)
    whole = (_clock(device) - started) / cycles
    return {"eager_ms": {k: 1000 * v / cycles for k, v in totals.items()}, "cycle_ms": 1000 * whole,
            "cycles": cycles, "cuda_graphs": engine.use_graphs}
