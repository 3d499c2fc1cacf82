"""The judge's recipe section (`method:`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from specdraft.core.errors import SpecdraftError


@dataclass
class JudgeConfig:
    draft: str = "runs/eagle3_smollm2/export"
    """The trained draft the judge serves beside (an EAGLE-3, PosS or Kangaroo export or run directory): mining
    drafts with it, and the export carries a copy of it."""
    check_timeout_s: float = 5.0
    """Time limit of one sandboxed code check (HumanEval prompts); a check past it labels nothing and counts as an
    error."""
    branch_batch_size: int = 64
    """Branches continued together by the target (one per mismatch: the draft's token accepted, the target's
    greedy answer after it)."""
    mine_judge: Optional[str] = None
    """A judge export or run directory (of the same draft and target) whose head decides acceptance in the mining
    runs, at `mine_threshold`: mismatches are then mined in the states judge decoding itself reaches, earlier
    judge-accepted tokens included, each labelled only where the target's own token there still solves the prompt.
    None: exact acceptance."""
    mine_threshold: float = 0.9
    """δ of `mine_judge` in the mining runs (a drafted token is accepted when its score exceeds it)."""

    def __post_init__(self):
        if self.check_timeout_s <= 0:
            raise SpecdraftError(f"method.check_timeout_s must be > 0, got {self.check_timeout_s}")
        if self.branch_batch_size < 1:
            raise SpecdraftError(f"method.branch_batch_size must be at least 1, got {self.branch_batch_size}")
        if self.mine_judge is not None and not str(self.mine_judge).strip():
            raise SpecdraftError(f"method.mine_judge must name a judge export or run directory, got "
                                 f"{self.mine_judge!r}")
        if not 0.0 <= self.mine_threshold <= 1.0:
            raise SpecdraftError(f"method.mine_threshold must be in [0, 1], got {self.mine_threshold}")
