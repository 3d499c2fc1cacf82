"""ViSpec's recipe section (`method:`): EAGLE-3's, and the image adaptor's queries."""
from __future__ import annotations

from dataclasses import dataclass

from specdraft.core.errors import SpecdraftError
from specdraft.methods.eagle3 import Eagle3Config, refuse_eagle31


@dataclass
class VispecConfig(Eagle3Config):
    num_queries: int = 2
    """Learned queries of the image adaptor: its first num_queries - 1 outputs stand in for each image's tokens in
    the draft's sequence, the last is the image's global feature (at least 2)."""

    def __post_init__(self):
        super().__post_init__()
        refuse_eagle31(self, "ViSpec")  # its unroll and drafter fuse and feed back as EAGLE-3 does
        if self.num_queries < 2:
            raise SpecdraftError(f"method.num_queries must be at least 2 (stand-ins and a global feature), "
                                 f"got {self.num_queries}")
