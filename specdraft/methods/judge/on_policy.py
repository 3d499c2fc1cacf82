"""On-policy mining (`method.mine_judge`): labels mined in the states judge decoding itself reaches.

A label mined under exact acceptance judges one mismatch in an otherwise exact answer, while judge decoding
accepts one after another, in prefixes that already hold earlier judge-accepted tokens: states the exact run never
visits, so the labels' precision overstates the accuracy judge decoding keeps. A second round (DAgger-style) mines
with a first round's judge deciding acceptance in the base runs (at `mine_threshold`), so that the prefixes hold
what that judge accepted. Every position where the draft's own next token differs from the target's is a
mismatch: those the judge accepted (read here from the trace's `target_next`, the target's argmax after each node)
and those it refused (the end of a cycle's accepted path, as under exact acceptance). Each is branched twice by
mining.py: the control (the target's own token) and the candidate (the draft's); the candidate's verdict labels
the mismatch only where the control's answer passes its check, i.e. where the state is still recoverable.

The data stage loads the judge (the method's RecordStage.guide: `specdraft.drafts.load_guide`, which never runs
code from its files, and checks it is a judge made for this target); here it is checked to be a judge of the same
draft (equal weights).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import BaseDraft
from specdraft.decoding.outputs import GenerationResult
from specdraft.methods.judge.config import JudgeConfig
from specdraft.methods.judge.model import LinearJudge
from specdraft.methods.shared import draft_digest


def mining_guide(cfg: JudgeConfig) -> Optional[Tuple[str, str]]:
    """The judge's RecordStage.guide: method.mine_judge, which the data stage loads (a judge, made for this
    target) into RecordContext.guide; None for exact mining."""
    return None if cfg.mine_judge is None else ("method.mine_judge", cfg.mine_judge)


def mining_judge(cfg: JudgeConfig, guide: Optional[BaseDraft], base: Optional[BaseDraft],
                 device: torch.device) -> Optional[LinearJudge]:
    """The loaded method.mine_judge (`guide`) at δ = `method.mine_threshold`, on `device`; None where it is unset
    (exact acceptance). A judge of another draft than `base` is a one-line error naming it."""
    if guide is None:
        return None
    if base is None or guide.base is None or not same_draft(guide.base, base):
        raise SpecdraftError(f"method.mine_judge={cfg.mine_judge} was made for another draft than "
                             f"method.draft={cfg.draft}")
    return LinearJudge(guide.draft.to(device), threshold=cfg.mine_threshold)


def same_draft(one: BaseDraft, other: BaseDraft) -> bool:
    """Whether two loaded base drafts are one draft: the same method and weights (their digests)."""
    return one.method == other.method and draft_digest(one.draft) == draft_digest(other.draft)


def judge_accepted(result: GenerationResult) -> List[Tuple[int, int, int]]:
    """(position in the answer, drafted token, the target's own token there) of every drafted token a traced run
    accepted where the target's argmax at its parent differs (the judge's doing), within the answer
    (`result.tokens`: the prefill's token, then each cycle's accepted tokens and bonus)."""
    found, emitted = [], 1
    for row in result.trace:
        accepted = row["accepted_nodes"]
        for depth, (parent, node) in enumerate(zip(accepted, accepted[1:])):
            own, position = row["target_next"][parent], emitted + depth
            if row["tokens"][node] != own and position < len(result.tokens):
                found.append((position, row["tokens"][node], own))
        emitted += len(accepted)  # the accepted drafted tokens and the bonus
    return found
