"""P-EAGLE's training: the rollout of every depth in one forward, then EAGLE-3's soft cross-entropy per depth.

Depth d (group d - 1) drafted from column t predicts token t + 1 + d against the target's distribution at
position t + d over the draft vocabulary, as EAGLE-3's TTT step d - 1 at column t does; its loss is the mean over
the columns the depth kept, weighted by depth_loss_decay ** (d - 1). Training draws each batch's rollout with
conditional drop-token sampling; without gradients (validation, tests) every depth keeps every column, so the
metrics are exact and repeatable. Metrics: acc@d (teacher-forced, over the depth's kept columns) and tau_sim
(1 + the sum over depths of the fraction of columns whose depths 1..d are all right, each fraction over the
columns depth d kept).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftBatch, LossOutput
from specdraft.kernels.rollout_attention import rollout_mask
from specdraft.kernels.soft_ce import soft_cross_entropy
from specdraft.methods.eagle3 import fused_features
from specdraft.methods.eagle3.ttt import configure_layers, draft_checkpointing, padded_rows, shifted
from specdraft.methods.peagle.config import PEagleConfig, cod_sizes
from specdraft.methods.peagle.model import PEagleDraft
from specdraft.methods.peagle.rollout import Rollout, rollout_inputs, sample_rollout
from specdraft.methods.shared import shift_left


def same_document(document_ids: Optional[torch.Tensor], shift: int):
    """[B, T] 1 where column t + shift lies in column t's document (1 everywhere for unpacked rows)."""
    if document_ids is None:
        return 1.0
    return (shift_left(document_ids, shift) == document_ids).float()


def head_loss(draft: PEagleDraft, hidden: torch.Tensor, target_rows: torch.Tensor, row_weights: torch.Tensor):
    """One depth's LM head and soft cross-entropy: hidden [B, n, H], target_rows [B*n, Vd], row_weights [B*n] ->
    (weighted loss sum, draft argmax [B, n])."""
    draft_logits = draft.logits(hidden)  # [B, n, Vd]
    loss = soft_cross_entropy(draft_logits.flatten(0, 1), target_rows, row_weights)
    return loss, draft_logits.detach().argmax(-1)


def checkpointed_head_loss(draft, hidden, target_rows, row_weights):
    """head_loss keeping no [B*n, Vd] logits for the backward (recomputed there)."""
    return checkpoint(head_loss, draft, hidden, target_rows, row_weights, use_reentrant=False)


def mask_embedding(draft: PEagleDraft, batch: DraftBatch) -> torch.Tensor:
    """The target's embedding of the mask token -> [H]."""
    table = batch.features.embed_tokens
    if table is None:
        raise SpecdraftError("P-EAGLE embeds its mask token with the target's embedding table, which this feature "
                             "source does not keep (a ZeRO-3 sharded target, or stored features holding index 0): "
                             "use data.features=online with train.shard_target=false")
    return table[draft.mask_token_id]


def rollout_hidden(draft: PEagleDraft, rollout: Rollout, fused: torch.Tensor, next_embeds: torch.Tensor,
                   mask_embed: torch.Tensor, positions: torch.Tensor, document_ids: Optional[torch.Tensor],
                   attention: str) -> torch.Tensor:
    """Every rollout row through the draft's decoder layer in one call: fused [B, T, H] (the fused features),
    next_embeds [B, T, H] (column t: embedding of token t + 1), mask_embed [H], positions [B, T], document_ids
    [B, T] or None -> hidden [B, L, H] (before the final norm)."""
    hidden, embeds, rotary = rollout_inputs(rollout, fused, next_embeds, draft.mask_hidden_input(), mask_embed,
                                            positions)
    mode = draft_checkpointing(draft)
    configure_layers(draft, mode)
    mask = rollout_mask(rollout.anchors, rollout.groups, document_ids, attention)
    return draft.rollout(hidden, embeds, positions=rotary, mask=mask, full_checkpoint=mode == "full")


def rollout_forward(draft: PEagleDraft, batch: DraftBatch, rollout: Rollout, attention: str) -> torch.Tensor:
    """rollout_hidden over a training batch -> hidden [B, L, H]."""
    feats, shape = batch.features, batch.input_ids.shape
    fused = fused_features(draft, feats.hidden_states)  # [B, T, H]
    next_embeds = shifted(padded_rows(feats.hidden_states[0].to(fused.dtype), 1), 1, shape)  # column t: x[t+1]
    positions = batch.position_ids if batch.position_ids is not None else \
        torch.arange(shape[1], device=fused.device).expand(shape)  # [B, T]
    return rollout_hidden(draft, rollout, fused, next_embeds, mask_embedding(draft, batch), positions,
                          batch.document_ids, attention)


def peagle_loss(draft: PEagleDraft, batch: DraftBatch, cfg: PEagleConfig) -> LossOutput:
    """Soft cross-entropy of every depth over one rollout forward, decayed by depth; metrics acc@d and tau_sim.
    As EAGLE-3's loss: positions whose target argmax lies outside the draft vocabulary carry no loss and count as
    rejected; in packed rows a column predicts only tokens of its own document."""
    feats, (batch_size, columns) = batch.features, batch.input_ids.shape
    depths = cfg.num_depths
    teacher = padded_rows(feats.logits_for(draft.draft_ids()), depths + 1)  # [B*T + K + 1, Vd]
    teacher_best = teacher.argmax(-1)  # [B*T + K + 1]
    in_vocab_all = feats.argmax_in(draft.t2d)  # [B, T]
    valid_all = (batch.loss_mask * batch.attention_mask).float()  # [B, T]
    # group g at column t predicts x[t + 2 + g]: an answer token of column t's document
    targets_valid = [shift_left(valid_all, group + 2) * same_document(batch.document_ids, group + 2)
                     for group in range(depths)]  # [B, T] each
    sizes = cod_sizes(columns, cfg) if torch.is_grad_enabled() else [columns] * depths
    rollout = sample_rollout([valid > 0 for valid in targets_valid], sizes)
    hidden_all = rollout_forward(draft, batch, rollout, cfg.attention)  # [B, L, H]
    row_base = torch.arange(batch_size, device=teacher.device)[:, None] * columns  # [B, 1]
    head = checkpointed_head_loss if draft_checkpointing(draft) in ("selective", "full") else head_loss
    loss = torch.zeros((), device=valid_all.device)
    metrics, chain, tau_sim = {}, None, 1.0
    for group in range(depths):
        anchors = rollout.group_anchors(group)  # [B, n]
        teacher_index = (row_base + anchors + group + 1).flatten()  # [B*n] the target's view at t + 1 + group
        target_rows = teacher[1:1 + batch_size * columns] if group == 0 else teacher[teacher_index]
        mask = targets_valid[group].gather(1, anchors)  # [B, n]
        in_vocab = shift_left(in_vocab_all, group + 1).gather(1, anchors)  # [B, n]
        loss_mask = mask * in_vocab
        group_loss, draft_best = head(draft, hidden_all[:, rollout.rows(group)], target_rows, loss_mask.flatten())
        loss = loss + cfg.depth_loss_decay ** group * group_loss / loss_mask.sum().clamp(min=1)
        with torch.no_grad():
            correct = (draft_best == teacher_best[teacher_index].view_as(anchors)) & in_vocab & (mask > 0)
            metrics[f"acc@{group + 1}"] = (correct.float() * mask).sum() / mask.sum().clamp(min=1)
            chain = correct if chain is None else correct & chain.gather(1, rollout.parents[group - 1])
            first = targets_valid[0].gather(1, anchors)  # the column drafts at all: depth 1 carries a loss
            tau_sim = tau_sim + (chain.float() * first).sum() / first.sum().clamp(min=1)
    metrics["tau_sim"] = tau_sim
    metrics["loss"] = loss.detach()
    return LossOutput(loss=loss, metrics=metrics)
