"""DFlash's recipe section (`method:`), the target layers its context reads and its mask token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.core.types import TargetInfo

ATTENTION_IMPLS = ("auto", "dense", "flex")
MAX_BLOCK = 64
"""The largest block: the runtime verifies a block's chain in one tree-attention window (kernels.tree_attention)."""


@dataclass
class DFlashConfig:
    block_size: int = 16
    """Positions one draft pass covers: the anchor (at inference the root, the newest confirmed token) and the
    block_size - 1 tokens drafted after it at once; 16 is the paper's published default (b16). 2..64."""
    num_layers: int = 1
    """Draft decoder layers (the paper's drafts have 1 to 5)."""
    gamma: float = 7.0
    """Loss decay: block position k (1-based, after the anchor) weighs exp(-(k - 1) / gamma); the paper's 7 for
    block size 16 (smaller blocks take smaller values: speculators uses 4 with its block 8)."""
    num_anchors: int = 512
    """Anchors sampled per sequence each step, one block each (a fixed number: static shapes); a sequence with
    fewer answer tokens fills the rest with blocks that carry no loss."""
    mask_token_id: Optional[int] = None
    """Target vocabulary id whose embedding (the target's own row, frozen) fills the block's positions after the
    anchor; the exports name it (vLLM, SGLang embed it from the target's table). None: the target's last id
    (vocab_size - 1), a reserved or padding row in most vocabularies (Llama-3's last reserved special token,
    Qwen3's padding rows); set the id your serving engine adds as its mask token when it adds one (z-lab's Qwen3
    drafts: 151669, `<|MASK|>`)."""
    feature_layers: Optional[List[int]] = None
    """Hidden-state indices (input of layer i) fused into the context through `fc`; None picks num_layers of them
    evenly spaced as the paper and SGLang do: the outputs of layers 1..L-3 (inputs 2..L-2), the middle one for a
    single layer."""
    draft_vocab_size: Optional[int] = None
    """None: the target's LM head and vocabulary, shared and frozen (the paper's draft; SGLang's layout needs it).
    A size: a trained head over the most frequent answer tokens (FR-Spec), exported in the speculators layout only."""
    intermediate_size: Optional[int] = None
    """Draft MLP width; None takes the target's."""
    init_std: float = 0.02
    """Standard deviation of the initial linear weights."""
    attention: str = "auto"
    """Block attention in training: auto (flex attention with a block mask on CUDA, dense elsewhere), dense, flex."""

    def __post_init__(self):
        if not 2 <= self.block_size <= MAX_BLOCK:
            raise SpecdraftError(f"method.block_size must be in 2..{MAX_BLOCK}, got {self.block_size}")
        if self.num_layers < 1:
            raise SpecdraftError(f"method.num_layers must be >= 1, got {self.num_layers}")
        if self.gamma <= 0:
            raise SpecdraftError(f"method.gamma must be > 0, got {self.gamma}")
        if self.num_anchors < 1:
            raise SpecdraftError(f"method.num_anchors must be >= 1, got {self.num_anchors}")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise SpecdraftError(f"method.mask_token_id must be a target vocabulary id (>= 0), got "
                                 f"{self.mask_token_id}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise SpecdraftError(f"method.draft_vocab_size must be >= 1 or null, got {self.draft_vocab_size}")
        if self.attention not in ATTENTION_IMPLS:
            raise choices_error("method.attention", self.attention, ATTENTION_IMPLS)


def dflash_feature_layers(cfg: DFlashConfig, target: TargetInfo) -> List[int]:
    """The hidden-state indices the context fuses (`DFlashConfig.feature_layers`), checked against the target."""
    layers = cfg.feature_layers or default_feature_layers(target.num_layers, cfg.num_layers)
    bad = [i for i in layers if not 0 < i < target.num_layers]
    if bad:
        raise SpecdraftError(f"method.feature_layers {bad} out of range; valid: 1..{target.num_layers - 1}")
    return list(layers)


def default_feature_layers(num_target_layers: int, count: int) -> List[int]:
    """`count` inputs of target layers: the outputs of layers 1..L-3 evenly spaced (index = output layer + 1), or
    the middle layer's alone for one."""
    if count == 1 or num_target_layers < 5:
        return [num_target_layers // 2 + 1] if count == 1 else list(range(1, num_target_layers))[:count]
    first, last = 1, num_target_layers - 3
    return [round(first + i * (last - first) / (count - 1)) + 1 for i in range(count)]


def mask_token_id(cfg: DFlashConfig, target: TargetInfo) -> int:
    """The mask token's id (`DFlashConfig.mask_token_id`), checked to be a row of the target's embedding table."""
    token = target.vocab_size - 1 if cfg.mask_token_id is None else cfg.mask_token_id
    if not 0 <= token < target.vocab_size:
        raise SpecdraftError(f"method.mask_token_id {token} is not an id of the target's vocabulary "
                             f"(0..{target.vocab_size - 1})")
    return token


def draft_vocab_size(cfg: DFlashConfig, target: TargetInfo) -> Optional[int]:
    """The trained head's size, capped at the target's vocabulary; None: the target's own head."""
    if cfg.draft_vocab_size is None or cfg.draft_vocab_size >= target.vocab_size:
        return None
    return cfg.draft_vocab_size
