"""EAGLE-3's loss: soft cross-entropy against the target's distribution over the draft vocabulary at every TTT
step, decayed by step, with acc@k and tau_sim. Packed rows (several conversations per row,
`data.pack_length`): a column predicts only tokens of its own conversation, so the loss equals that of the
conversations in separate rows. Long batches (method.loss_chunk_rows) run the LM head and the loss in row chunks,
each recomputed in the backward; LongSpec's anchor offsets (method.position_offset) shift the training positions."""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from specdraft.core.types import DraftBatch, LossOutput, TargetFeatures
from specdraft.kernels.soft_ce import soft_cross_entropy
from specdraft.methods.eagle3.config import Eagle3Config
from specdraft.methods.eagle3.model import Eagle3Draft, compute_dtype
from specdraft.methods.eagle3.ttt import anchor_offset_positions, draft_checkpointing, shifted, ttt_unroll
from specdraft.methods.shared import shift_left


def _same_document(document_ids: Optional[torch.Tensor], shift: int):
    """[B, T] 1 where column t + shift lies in column t's document (1 everywhere for unpacked rows)."""
    if document_ids is None:
        return 1.0
    return (shift_left(document_ids, shift) == document_ids).float()


@torch.no_grad()
def _teacher_rows(features: TargetFeatures, vocab_ids: torch.Tensor, count: int, pad: int) -> torch.Tensor:
    """The target's logits over the draft vocabulary (TargetFeatures.logits_for), rows flattened, `pad` zero rows
    after: [count + pad, Vd] (count = B*T), written in place (no second [B*T, Vd] copy: 4 GiB at 65,536 tokens and a 32k vocabulary).

    Computed once per batch; each TTT step reads a shifted view of it (no per-step copies)."""
    dtype = compute_dtype(features.lm_head)  # autocast's, as logits_for's matmul would compute in
    rows = features.lm_head.new_empty(count + pad, vocab_ids.shape[0], dtype=dtype)
    features.logits_into(vocab_ids, rows[:count])
    rows[count:].zero_()
    return rows


def _head_loss(draft: Eagle3Draft, hidden: torch.Tensor, target_rows: torch.Tensor, row_weights: torch.Tensor):
    """One TTT step's LM head and soft cross-entropy: hidden [B, T, H], target_rows [B*T, Vd], row_weights
    [B*T] -> (weighted loss sum, draft argmax [B, T])."""
    draft_logits = draft.logits(hidden)  # [B, T, Vd]
    loss = soft_cross_entropy(draft_logits.flatten(0, 1), target_rows, row_weights)
    return loss, draft_logits.detach().argmax(-1)


def _rows_head_loss(draft: Eagle3Draft, hidden_rows: torch.Tensor, target_rows: torch.Tensor,
                    row_weights: torch.Tensor):
    """_head_loss of flattened rows: hidden_rows [N, H], target_rows [N, Vd], row_weights [N] -> (loss sum, argmax
    [N])."""
    draft_logits = draft.logits(hidden_rows)  # [N, Vd]
    return soft_cross_entropy(draft_logits, target_rows, row_weights), draft_logits.detach().argmax(-1)


def chunked_head_loss(chunk_rows: int):
    """_head_loss over row chunks of `chunk_rows`, each checkpointed: no more than chunk_rows x Vd logits exist at
    once, in the forward or the backward (which recomputes each chunk's LM head)."""
    def head_loss(draft, hidden, target_rows, row_weights):
        rows = hidden.flatten(0, 1)  # [B*T, H]
        loss, best = torch.zeros((), device=rows.device), []
        for start in range(0, rows.shape[0], chunk_rows):
            part = slice(start, start + chunk_rows)
            part_loss, part_best = checkpoint(_rows_head_loss, draft, rows[part], target_rows[part], row_weights[part],
                                              use_reentrant=False)
            loss, best = loss + part_loss, best + [part_best]
        return loss, torch.cat(best).view(hidden.shape[:2])
    return head_loss


def _checkpointed_head_loss(draft, hidden, target_rows, row_weights):
    """_head_loss keeping no [B*T, Vd] tensor for the backward: the logits are recomputed there (one more
    LM-head matmul per step) instead of 2 bytes x Vd per token and step being kept."""
    return checkpoint(_head_loss, draft, hidden, target_rows, row_weights, use_reentrant=False)


def eagle3_loss(draft: Eagle3Draft, batch: DraftBatch, cfg: Eagle3Config, unroll=ttt_unroll) -> LossOutput:
    """Soft cross-entropy over the TTT unroll, decayed by step; metrics acc@k (teacher-forced) and tau_sim.

    The teacher is the target's distribution over the draft vocabulary; positions whose target argmax lies
    outside it carry no loss (FR-Spec) and count as rejected in the metrics. In packed rows a column predicts
    only tokens of its own document. `unroll` yields each step's hidden state (PosS passes its own, which
    routes steps through its specialists) and takes ttt_unroll's arguments."""
    feats, shape = batch.features, batch.input_ids.shape
    teacher = _teacher_rows(feats, draft.draft_ids(), shape.numel(), cfg.ttt_steps + 1)  # [B*T + K + 1, Vd] target's dtype
    teacher_best = teacher.argmax(-1)  # [B*T + K + 1]
    in_vocab_all = feats.argmax_in(draft.t2d)  # [B, T]
    valid_all = (batch.loss_mask * batch.attention_mask).float()  # [B, T]
    loss = torch.zeros((), device=valid_all.device)
    metrics, chain_alive, chain_len = {}, None, torch.zeros_like(valid_all)
    positions = batch.position_ids
    if cfg.position_offset and draft.training:
        positions = anchor_offset_positions(positions, batch.document_ids, shape, cfg.attention_sinks,
                                            cfg.position_offset, valid_all.device)
    steps = unroll(draft, feats.hidden_states, cfg.ttt_steps, positions, batch.document_ids, cfg.attention,
                   logits=False)
    head_loss = _checkpointed_head_loss if draft_checkpointing(draft) in ("selective", "full") else _head_loss
    if 0 < cfg.loss_chunk_rows < valid_all.numel():
        head_loss = chunked_head_loss(cfg.loss_chunk_rows)
    for step, hidden in enumerate(steps):
        target_rows = teacher[step + 1: step + 1 + valid_all.numel()]  # [B*T, Vd] the target's view at t+1+step
        in_vocab = shift_left(in_vocab_all, step + 1)
        # the predicted token x[t+2+step] is an answer token of column t's document
        mask = shift_left(valid_all, step + 2) * _same_document(batch.document_ids, step + 2)
        loss_mask = mask * in_vocab  # [B, T]
        step_loss, draft_best = head_loss(draft, hidden, target_rows, loss_mask.flatten())
        loss = loss + cfg.step_loss_decay ** step * step_loss / loss_mask.sum().clamp(min=1)
        with torch.no_grad():
            target_best = shifted(teacher_best, step + 1, shape)  # [B, T]
            correct = (draft_best == target_best) & in_vocab & (mask > 0)
            metrics[f"acc@{step + 1}"] = (correct.float() * mask).sum() / mask.sum().clamp(min=1)
            chain_alive = correct if chain_alive is None else chain_alive & correct
            chain_len = chain_len + chain_alive.float()
    first_mask = shift_left(valid_all, 2) * _same_document(batch.document_ids, 2)
    metrics["tau_sim"] = 1.0 + (chain_len * first_mask).sum() / first_mask.sum().clamp(min=1)
    metrics["loss"] = loss.detach()
    return LossOutput(loss=loss, metrics=metrics)
