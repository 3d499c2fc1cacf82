"""What the speculative engine hands back: a generation's tokens and per-cycle statistics (`GenerationResult`), one
cycle's device output (`CycleOutput`), and the host's helpers over them (when an answer ends, where it is cut, a
cycle's trace row)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from specdraft.decoding.tree import DraftTree


@dataclass
class GenerationResult:
    tokens: List[int]  # new tokens (prompt excluded), cut after EOS or at max_new_tokens
    accepted: List[int] = field(default_factory=list)  # drafted tokens accepted, per cycle
    drafted: List[int] = field(default_factory=list)  # drafted tokens verified, per cycle (exits, pruning vary it)
    exits: List[int] = field(default_factory=list)  # the drafter's exit index per cycle (dynamic_exit.ExitChoice)
    verify_rows: List[Optional[int]] = field(default_factory=list)  # rows the verify ran per cycle, padding
    # included (a tree's; None for a chain's or a drafting policy's cycles)
    seconds: float = 0.0
    trace: List[dict] = field(default_factory=list)  # per cycle when asked: tree, draft probs, accepted path


@dataclass
class CycleOutput:
    emitted: torch.Tensor  # [depth + 1] accepted drafted tokens then the bonus token, padded
    count: torch.Tensor  # [1] how many of `emitted` are valid (accepted + 1)
    accepted_nodes: torch.Tensor  # [depth + 1] node indices of the accepted path, -1 padded
    tree: Optional[DraftTree] = None
    for_host: Optional[torch.Tensor] = None  # what the host reads of a cycle: [depth + 2] count, then emitted
    # (then, with a tree scorer, the tree's valid nodes)
    target_next: Optional[torch.Tensor] = None  # [N] the target's argmax after each node of `tree` (read by traces
    # alone: under a judge an accepted token may not be the target's own choice)


def finished(generated: List[int], new_tokens: List[int], eos_ids: Sequence[int], max_new_tokens: int) -> bool:
    """Whether to stop: enough tokens, or an EOS among the newest ones (the older ones were checked before)."""
    return len(generated) >= max_new_tokens or any(t in eos_ids for t in new_tokens)


def cut_answer(generated: List[int], eos_ids: Sequence[int], max_new_tokens: int) -> List[int]:
    for position, token in enumerate(generated[:max_new_tokens]):
        if token in eos_ids:
            return generated[:position + 1]
    return generated[:max_new_tokens]


def trace_row(out: CycleOutput) -> dict:
    tree = out.tree
    row = {"tokens": tree.tokens.tolist(), "parents": tree.parents.tolist(), "valid": tree.valid.tolist(),
           "draft_logprobs": [round(x, 5) if x != float("-inf") else None for x in tree.joint_logprobs.tolist()],
           "accepted_nodes": [n for n in out.accepted_nodes.tolist() if n >= 0]}
    if out.target_next is not None:
        row["target_next"] = out.target_next.tolist()
    return row
