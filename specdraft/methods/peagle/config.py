"""P-EAGLE's recipe section (`method:`): the EAGLE-3 head's fields it builds on, the number of depths one forward
drafts, the conditional drop-token sampling that bounds its training memory, and the mask token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.core.types import TargetInfo
from specdraft.kernels.rollout_attention import IMPLS as ATTENTION_IMPLS
from specdraft.kernels.ttt_attention import TTTWindow


@dataclass
class PEagleConfig:
    num_depths: int = 8
    """K: tokens one forward drafts. Depth 1 comes from the prefix's last column as EAGLE-3's first token does;
    depths 2..K from mask inputs in the same forward. The runtime drafts at most K (runtime.depth <= K); the
    speculators export's speculative_tokens."""
    depth_loss_decay: float = 0.8
    """Weight of depth d's loss is depth_loss_decay ** (d - 1) (each depth's loss a mean over its kept positions)."""
    keep_ratio: float = 0.7
    """Conditional drop-token sampling, r: depth d > 1 trains on about T * max(r ** (d - 1), keep_floor) of a
    row's T columns, drawn among those depth d - 1 kept (answer positions first), so a batch runs
    T * (1 + sum of those ratios) rows instead of T * K."""
    keep_floor: float = 0.2
    """The least fraction of a row's columns any depth keeps (conditional drop-token sampling)."""
    mask_token_id: Optional[int] = None
    """The token whose embedding (the target's own row) is the token input of depths 2..K, beside the learned
    `mask_hidden` in place of the target's features; None: the target's end-of-sequence token. Exported as
    speculators' mask_token_id and vLLM's pard_token."""
    draft_vocab_size: int = 32000
    """Size of the frequency-ranked draft vocabulary (capped at the target's vocabulary)."""
    feature_layers: Optional[List[int]] = None
    """Hidden-state indices to fuse (input of layer i); None picks (2, L // 2, L - 3), as EAGLE-3."""
    intermediate_size: Optional[int] = None
    """Draft MLP width; None takes the target's."""
    init_std: float = 0.02
    """Standard deviation of the initial linear weights (mask_hidden is drawn from N(0, 1))."""
    attention: str = "auto"
    """Training attention over the rollout rows: auto (flex attention with a block mask on CUDA, dense
    elsewhere), dense, flex."""
    fc_norm: bool = False
    """EAGLE-3.1's per-feature RMSNorm before `fc` (Eagle3Config.fc_norm), on mask_hidden too."""

    def __post_init__(self):
        if self.num_depths < 1:
            raise SpecdraftError(f"method.num_depths must be >= 1, got {self.num_depths}")
        if not 0.0 < self.depth_loss_decay <= 1.0:
            raise SpecdraftError(f"method.depth_loss_decay must be in (0, 1], got {self.depth_loss_decay}")
        if not 0.0 < self.keep_ratio <= 1.0:
            raise SpecdraftError(f"method.keep_ratio must be in (0, 1], got {self.keep_ratio}")
        if not 0.0 < self.keep_floor <= 1.0:
            raise SpecdraftError(f"method.keep_floor must be in (0, 1], got {self.keep_floor}")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise SpecdraftError(f"method.mask_token_id must be a token id >= 0 (or null: the target's end-of-"
                                 f"sequence token), got {self.mask_token_id}")
        if self.attention not in ATTENTION_IMPLS:
            raise choices_error("method.attention", self.attention, ATTENTION_IMPLS)

    @property
    def ttt_steps(self) -> int:
        """The tokens a cycle drafts, under the name EAGLE-3's export helpers read (num_depths)."""
        return self.num_depths

    def ttt_window(self):
        """The head's attention window under the name EAGLE-3's model reads: full attention (P-EAGLE's rollout
        attention has no window)."""
        return TTTWindow(size=0, sinks=0)

    @property
    def norm_output(self) -> bool:
        """EAGLE-3.1's norm_output does not apply: no depth reads another's output (EAGLE-3's head reads it)."""
        return False


def resolve_mask_token(cfg: PEagleConfig, target: TargetInfo) -> int:
    """method.mask_token_id, or the target's end-of-sequence token, checked against the target's vocabulary."""
    token = target.eos_token_id if cfg.mask_token_id is None else cfg.mask_token_id
    if token is None:
        raise SpecdraftError("the target names no end-of-sequence token for P-EAGLE's mask input; set "
                             "method.mask_token_id to a token id")
    if not 0 <= token < target.vocab_size:
        raise SpecdraftError(f"method.mask_token_id {token} is not a token of the target; valid: "
                             f"0..{target.vocab_size - 1}")
    return int(token)


def cod_sizes(columns: int, cfg: PEagleConfig) -> List[int]:
    """Rows of each depth's group in a batch row of `columns` columns: [T, n_2, ..., n_K], n_d =
    max(1, int(T * max(r ** (d - 1), floor))), never more than the depth before keeps."""
    sizes = [columns]
    for group in range(1, cfg.num_depths):
        share = max(cfg.keep_ratio ** group, cfg.keep_floor)
        sizes.append(min(sizes[-1], max(1, int(columns * share))))
    return sizes
