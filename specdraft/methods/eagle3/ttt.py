"""Training-time test (TTT): the EAGLE-3 head unrolled `steps` times on its own outputs over a whole sequence.

Columns t = 0..T-1 of a sequence x:
  step 0: hidden = fc(target features at t), token x[t+1]  -> predicts x[t+2]
  step j: hidden = step j-1's output at t,  token x[t+1+j] -> predicts x[t+2+j]
Step j at column t stands for sequence position t + j, so its rotary position is t + j, and it attends to the
step-0 keys of columns <= t plus the keys that steps 1..j wrote at column t: exactly what the draft sees at
inference after drafting j tokens. `ttt_inputs` prepares what every step reads (heads built on EAGLE-3, PosS,
run their own unroll over it), `ttt_unroll` is EAGLE-3's. The draft's attention window (method.attention_window)
rides in the unroll's mask; LongSpec's anchor-offset positions (`anchor_offset_positions`) come in as position_ids.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
from torch.utils.checkpoint import checkpoint

from specdraft.config import checkpointing_mode
from specdraft.kernels.ttt_attention import ttt_mask
from specdraft.layers.cast import UnrollCasts
from specdraft.methods.eagle3.model import Eagle3DecoderLayer, Eagle3Draft, fused_features


def padded_rows(x: torch.Tensor, pad: int) -> torch.Tensor:
    """[B, T, ...] -> [B*T + pad, ...]: the rows flattened, then `pad` zero rows (room for shifted views)."""
    flat = x.flatten(0, 1)
    return torch.cat([flat, flat.new_zeros(pad, *flat.shape[1:])])


def shifted(rows: torch.Tensor, shift: int, shape: torch.Size) -> torch.Tensor:
    """A view of `rows` (from padded_rows) as [B, T, ...] where column t holds row t + shift.

    Unlike shift_left, the last `shift` columns of a batch row read the next row's first ones: those columns
    predict tokens past the row's end and carry no loss, and attention never carries them to earlier columns."""
    return rows[shift: shift + shape[0] * shape[1]].view(*shape[:2], *rows.shape[1:])



def draft_checkpointing(draft) -> str:
    """The draft's activation checkpointing mode for this forward (CHECKPOINTING): none without autograd."""
    if not torch.is_grad_enabled():
        return "none"
    return checkpointing_mode(getattr(draft, "activation_checkpointing", "none"))


def configure_layers(draft, mode: str) -> None:
    """Every Eagle3DecoderLayer of the draft (PosS: each specialist) runs this unroll with `mode` and, when the
    draft asks for it (compile_layers), its compiled parts."""
    compiled = bool(getattr(draft, "compile_layers", False))
    for module in draft.modules():
        if isinstance(module, Eagle3DecoderLayer):
            module.checkpointing, module.compiled = mode, compiled


def checkpointed_step(step):
    """`step` under activation checkpointing: its activations are recomputed in the backward, not kept. The
    recomputation sees a snapshot of `cache` (the unroll appends to the list afterwards)."""
    def run(hidden, embeds, positions, query_cols, cache, mask=None):
        return checkpoint(step, hidden, embeds, positions, query_cols, list(cache), mask=mask, use_reentrant=False)
    return run


@dataclass
class TTTInputs:
    """What every step of a training-time-test unroll reads (eagle3 and the methods built on it)."""

    fused: torch.Tensor  # [B, T, H] fc of the target features: step 0's hidden input
    embeds_rows: torch.Tensor  # [B*T + K, H] the target embeddings, rows flattened and padded
    shape: torch.Size  # [B, T, H]
    cols: torch.Tensor  # [T] TTT columns
    positions: torch.Tensor  # [T] or [B, T] rotary positions of step 0
    mask: Any  # the attention mask of specdraft.kernels.ttt_attention.ttt_mask
    run_step: Any  # draft.step: its layers' weights cast once for the unroll, or (full) each step checkpointed

    def embeds(self, shift: int) -> torch.Tensor:  # [B, T, H]: column t holds the embedding of x[t + shift]
        return shifted(self.embeds_rows, shift, self.shape)


def ttt_inputs(draft, hidden_states: Dict[int, torch.Tensor], steps: int, position_ids=None, document_ids=None,
               attention: str = "auto", checkpointed=None) -> TTTInputs:
    """`checkpointed(step)` wraps draft.step for full activation checkpointing (default: this module's); the
    lighter modes act inside the decoder layers, which this sets up for the unroll."""
    embeds_all = hidden_states[0]  # [B, T, H] target embeddings of x
    batch, num_cols = embeds_all.shape[:2]
    cols = torch.arange(num_cols, device=embeds_all.device)
    mode = draft_checkpointing(draft)
    configure_layers(draft, mode)
    run_step = (checkpointed or checkpointed_step)(draft.step) if mode == "full" else \
        functools.partial(draft.step, weights_for=UnrollCasts())
    fused = fused_features(draft, hidden_states)
    return TTTInputs(fused=fused, embeds_rows=padded_rows(embeds_all.to(fused.dtype), steps),
                     shape=embeds_all.shape, cols=cols,
                     positions=cols if position_ids is None else position_ids,
                     mask=ttt_mask(document_ids, batch, num_cols, embeds_all.device, attention, draft.attention_window),
                     run_step=run_step)


def anchor_offset_positions(position_ids: Optional[torch.Tensor], document_ids: Optional[torch.Tensor],
                            shape: torch.Size, anchors: int, max_offset: int, device) -> torch.Tensor:
    """LongSpec's anchor-offset indices: each document's rotary positions from `anchors` on shifted by an offset
    drawn uniformly from 0..max_offset (one per document), the first `anchors` (the attention sinks) kept.
    position_ids, document_ids [B, T] of packed rows (None: one document a row, positions 0..T-1) -> [B, T]."""
    batch, cols = shape[:2]
    positions = position_ids if position_ids is not None else \
        torch.arange(cols, device=device).expand(batch, cols)
    offsets = torch.randint(0, max_offset + 1, (batch, cols), device=device)  # [B, T]: one for each document id
    if document_ids is not None:
        offsets = offsets.gather(1, document_ids.clamp(max=cols - 1))
    else:
        offsets = offsets[:, :1]
    return torch.where(positions >= anchors, positions + offsets, positions)


def ttt_unroll(draft: Eagle3Draft, hidden_states: Dict[int, torch.Tensor], steps: int,
               position_ids: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
               attention: str = "auto", logits: bool = True):
    """Training-time test: yields each step's draft logits [B, T, Vd]; column t of step j predicts x[t+2+j].

    position_ids, document_ids [B, T] describe packed rows (positions restart at each document; attention stays
    within it); None is one document per row. `attention`: see specdraft.kernels.ttt_attention.ttt_mask.
    logits=False yields each step's hidden state [B, T, H] instead (draft.logits of it are the logits)."""
    ttt = ttt_inputs(draft, hidden_states, steps, position_ids, document_ids, attention)
    fed, cache = ttt.fused, []
    for step in range(steps):
        hidden, kv = ttt.run_step(fed, ttt.embeds(step + 1), ttt.positions + step, ttt.cols, cache, mask=ttt.mask)
        cache.append(kv)
        fed = draft.fed_back(hidden)  # what step + 1 reads (EAGLE-3.1's norm_output: normed)
        yield draft.logits(hidden) if logits else hidden
