"""EAGLE-3's recipe section (`method:`) and the target layers its head fuses."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.core.types import TargetInfo
from specdraft.kernels.ttt_attention import IMPLS as ATTENTION_IMPLS
from specdraft.kernels.ttt_attention import TTTWindow


@dataclass
class Eagle3Config:
    ttt_steps: int = 7
    """Draft steps unrolled per training example (training-time test)."""
    step_loss_decay: float = 0.8
    """Weight of step j's loss is step_loss_decay ** j."""
    draft_vocab_size: int = 32000
    """Size of the frequency-ranked draft vocabulary (capped at the target's vocabulary)."""
    feature_layers: Optional[List[int]] = None
    """Hidden-state indices to fuse (input of layer i); None picks (2, L // 2, L - 3)."""
    intermediate_size: Optional[int] = None
    """Draft MLP width; None takes the target's."""
    init_std: float = 0.02
    """Standard deviation of the initial linear weights."""
    attention: str = "auto"
    """TTT attention in training: auto (flex attention with block masks on CUDA, dense elsewhere), dense, flex."""
    init_from: Optional[str] = None
    """An EAGLE-3 run directory or `hf` export whose weights start the training (a warm start: more steps, another
    schedule or more data); None starts from random weights."""
    attention_window: int = 0
    """LongSpec's sliding window (arXiv:2502.17421): the draft attends to the step-0 keys of its `attention_window`
    newest positions (its own among them) and of the method.attention_sinks first ones, in training (the TTT
    attention) and in the runtime, whose draft KV cache is then a ring of attention_sinks + attention_window
    positions (plus the drafting slots), the same size at any context length. Exports write it as the layer's
    `sliding_window` (vLLM reads it; no engine reads the sinks). 0 (the default): full attention; a window at least
    as long as a sequence is full attention for that sequence."""
    attention_sinks: int = 4
    """The first positions of each sequence that the draft always attends to beside its window (LongSpec's attention
    sinks), and the anchors method.position_offset leaves in place. Read only with a window or an offset."""
    position_offset: int = 0
    """LongSpec's anchor-offset indices, in training: each sequence's rotary positions from method.attention_sinks on
    are shifted by an offset drawn uniformly from 0..position_offset (a new one for each sequence and step), so that
    sequences of data.max_length tokens train the positions up to data.max_length + position_offset that long
    contexts reach at inference: set it to the target's context less data.max_length (SmolLM2: 8192 - 2048).
    Validation and the runtime use the true positions. 0 (the default): none."""
    loss_chunk_rows: int = 32768
    """A batch of more rows (micro-batch x sequence length) runs the LM head and the loss this many rows at a time,
    each chunk's logits recomputed in the backward instead of kept (2 bytes x draft vocabulary a row and TTT step:
    28 GiB at 65,536 tokens, 7 steps and a 32k vocabulary); a batch of at most this many rows runs as one chunk, as
    without chunks. 0: never chunked."""
    fc_norm: bool = False
    """EAGLE-3.1: an RMSNorm of its own on each fused target feature before `fc`, fc(concat(norm_i(h_i))), so that
    layers of different scales enter the fusion alike (tensors fc_norm.{i}.weight). Exported under this name, the
    key vLLM's and SGLang's EAGLE-3 configs read."""
    norm_output: bool = False
    """EAGLE-3.1: a draft step hands the next one its output after the final norm (what the LM head reads) rather
    than before it, so the fed-back state keeps one scale at every depth. Exported under this name, the key vLLM's
    and SGLang's EAGLE-3 configs read."""

    def __post_init__(self):
        if self.ttt_steps < 1:
            raise SpecdraftError(f"method.ttt_steps must be >= 1, got {self.ttt_steps}")
        if not 0.0 < self.step_loss_decay <= 1.0:
            raise SpecdraftError(f"method.step_loss_decay must be in (0, 1], got {self.step_loss_decay}")
        if self.attention not in ATTENTION_IMPLS:
            raise choices_error("method.attention", self.attention, ATTENTION_IMPLS)
        for name in ("attention_window", "attention_sinks", "position_offset", "loss_chunk_rows"):
            if getattr(self, name) < 0:
                raise SpecdraftError(f"method.{name} must be 0 (off) or a positive number, got {getattr(self, name)}")

    def ttt_window(self) -> TTTWindow:
        """The draft's attention window (TTTWindow: size 0 is full attention)."""
        return TTTWindow(size=self.attention_window, sinks=self.attention_sinks if self.attention_window else 0)


EAGLE31_FLAGS = ("fc_norm", "norm_output")
"""EAGLE-3.1's recipe switches on the EAGLE-3 head (Eagle3Config's fields of these names)."""


def refuse_eagle31(cfg, method: str) -> None:
    """A head built on EAGLE-3's whose own parts (an unroll, a drafter) do not implement EAGLE-3.1's switches: one
    line naming the key that is on."""
    for flag in EAGLE31_FLAGS:
        if getattr(cfg, flag):
            raise SpecdraftError(f"method.{flag}=true (EAGLE-3.1) is not supported by {method}; set it to false")


def eagle3_feature_layers(cfg: Eagle3Config, target: TargetInfo) -> List[int]:
    layers = cfg.feature_layers or [2, target.num_layers // 2, target.num_layers - 3]
    bad = [i for i in layers if not 0 < i < target.num_layers]
    if bad:
        raise SpecdraftError(f"method.feature_layers {bad} out of range; valid: 1..{target.num_layers - 1}")
    return list(layers)
