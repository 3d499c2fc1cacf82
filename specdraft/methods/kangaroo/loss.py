"""Kangaroo's loss: step 0's soft cross-entropy against the target's next-token distribution, and the chain
metrics a teacher-forced step 0 gives for every step (the package docstring says why no unroll is needed)."""
from __future__ import annotations

from typing import Dict

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftBatch, LossOutput
from specdraft.kernels.soft_ce import soft_cross_entropy
from specdraft.methods.kangaroo.config import KangarooConfig
from specdraft.methods.kangaroo.model import KangarooDraft
from specdraft.methods.shared import shift_left


def chain_metrics(correct: torch.Tensor, mask: torch.Tensor, steps: int) -> Dict[str, torch.Tensor]:
    """correct, mask [B, T] of step 0 -> acc@1..steps and tau_sim; step j at column t is step 0 at t + j."""
    metrics, chain_alive, chain_len = {}, None, torch.zeros_like(mask)
    for step in range(steps):
        step_correct, step_mask = shift_left(correct, step), shift_left(mask, step)
        metrics[f"acc@{step + 1}"] = (step_correct.float() * step_mask).sum() / step_mask.sum().clamp(min=1)
        chain_alive = step_correct if chain_alive is None else chain_alive & step_correct
        chain_len = chain_len + chain_alive.float()
    metrics["tau_sim"] = 1.0 + (chain_len * mask).sum() / mask.sum().clamp(min=1)
    return metrics


def kangaroo_loss(draft: KangarooDraft, batch: DraftBatch, cfg: KangarooConfig) -> LossOutput:
    """Soft cross-entropy against the target's next-token distribution over the draft vocabulary; positions
    whose target argmax lies outside it carry no loss (FR-Spec) and count as rejected in the metrics."""
    if batch.document_ids is not None:
        raise SpecdraftError("Kangaroo trains on unpacked rows: leave data.pack_length unset")
    feats = batch.features
    shallow = feats.hidden_states[draft.exit_layer]  # [B, T, H]
    positions = torch.arange(shallow.shape[1], device=shallow.device)
    hidden, _ = draft(shallow.to(draft.input_layernorm.weight.dtype), positions)
    draft_logits = draft.target_logits_fn()(hidden)  # [B, T, Vd]
    target_logits = feats.logits_for(draft.draft_ids())  # [B, T, Vd]: column t scores x[t+1]
    in_vocab = feats.argmax_in(draft.t2d)  # [B, T]
    mask = shift_left((batch.loss_mask * batch.attention_mask).float(), 1)  # x[t+1] is an answer token
    loss_mask = mask * in_vocab
    loss = soft_cross_entropy(draft_logits.flatten(0, 1), target_logits.flatten(0, 1), loss_mask.flatten())
    loss = loss / loss_mask.sum().clamp(min=1)
    with torch.no_grad():
        correct = (draft_logits.argmax(-1) == target_logits.argmax(-1)) & in_vocab & (mask > 0)
        metrics = chain_metrics(correct, mask, cfg.ttt_steps)
    metrics["loss"] = loss.detach()
    return LossOutput(loss=loss, metrics=metrics)
