"""Kangaroo's recipe section and the exit layer ℓ it resolves to on a target."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo


@dataclass
class KangarooConfig:
    exit_layer: Optional[int] = None
    """ℓ: the adapter reads hidden state ℓ, the input of target layer ℓ; None: max(1, round(L / 16))."""
    ttt_steps: int = 7
    """Chain positions simulated per column for acc@k and tau_sim (teacher forcing is exact: module docstring)."""
    draft_vocab_size: Optional[int] = None
    """Rows of the target's LM head the draft scores (most frequent answer tokens); None: the whole vocabulary."""
    exit_threshold: float = 0.6
    """η: the runtime stops drafting when the adapter's top-1 probability falls below it (0: never early)."""
    init_std: float = 0.02
    """Standard deviation of the initial adapter projections."""

    def __post_init__(self):
        if self.ttt_steps < 1:
            raise SpecdraftError(f"method.ttt_steps must be >= 1, got {self.ttt_steps}")
        if not 0.0 <= self.exit_threshold < 1.0:
            raise SpecdraftError(f"method.exit_threshold must be in [0, 1), got {self.exit_threshold}")


def kangaroo_exit_layer(cfg: KangarooConfig, target: TargetInfo) -> int:
    layer = cfg.exit_layer if cfg.exit_layer is not None else max(1, round(target.num_layers / 16))
    if not 0 < layer < target.num_layers:
        raise SpecdraftError(f"method.exit_layer {layer} out of range; valid: 1..{target.num_layers - 1}")
    return layer


def kangaroo_feature_layers(cfg: KangarooConfig, target: TargetInfo) -> List[int]:
    return [kangaroo_exit_layer(cfg, target)]
