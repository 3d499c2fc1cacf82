"""PosS's recipe section: EAGLE-3's fields plus the specialists' count and width."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from specdraft.core.errors import SpecdraftError
from specdraft.methods.eagle3 import Eagle3Config, refuse_eagle31


@dataclass
class PossConfig(Eagle3Config):
    num_specialists: int = 3
    """Decoder layers, one per band of draft positions (3 with 2 positions each covers a chain of 6)."""
    positions_per_specialist: int = 2
    """n of PosS-n: specialist j drafts positions [j·n, (j+1)·n); later positions use the last specialist."""
    init_from: Optional[str] = None
    """An EAGLE-3 run directory or `hf` export whose fc, vocabulary, norm, LM head and (copied into every
    specialist) decoder layer start the training; None starts from random weights."""

    def __post_init__(self):
        super().__post_init__()
        refuse_eagle31(self, "PosS")  # its unroll and drafter fuse and feed back as EAGLE-3 does
        if self.num_specialists < 1 or self.positions_per_specialist < 1:
            raise SpecdraftError(f"method.num_specialists and method.positions_per_specialist must be >= 1, got "
                                 f"{self.num_specialists} and {self.positions_per_specialist}")
        trained = math.ceil(self.ttt_steps / self.positions_per_specialist)
        if self.num_specialists > trained:
            raise SpecdraftError(f"method.num_specialists={self.num_specialists} leaves specialists untrained: "
                                 f"{self.ttt_steps} TTT steps of {self.positions_per_specialist} positions each "
                                 f"reach at most {trained}")
