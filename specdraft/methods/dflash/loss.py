"""DFlash's loss: per sequence, `num_anchors` anchors sampled among its answer tokens, one block each (the anchor's
embedding, then the mask token's), all blocks in one forward under the block attention mask (blocks.py). Block
position k (1-based after the anchor, the token at anchor + k) is trained by soft cross-entropy against the target's
distribution there (its logits at column anchor + k - 1), weighted by exp(-(k - 1) / gamma) and by whether that token
is an answer token of the anchor's document inside the row; the sum is divided by the positions that carry a loss.
Training steps draw their anchors from the global random stream (seeded with the run); without gradients (validation,
a reloaded export's check) the draw is seeded the same every call, so that one batch always scores the same blocks.
Metrics: acc@k (the draft's argmax is the target's at block position k) and tau_sim (1 + the mean run of such
positions from k = 1, a block's greedy acceptance)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from specdraft.config import checkpointing_mode
from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftBatch, LossOutput, TargetFeatures
from specdraft.kernels.soft_ce import soft_cross_entropy
from specdraft.methods.dflash.blocks import Anchors, anchor_candidates, block_columns, block_mask, sample_anchors
from specdraft.methods.dflash.config import DFlashConfig
from specdraft.methods.dflash.model import DFlashDraft

HEAD_CHUNK_ROWS = 4096
"""Rows of block positions whose LM-head logits exist at once when the head is checkpointed."""


def target_embeddings(features: TargetFeatures, target_vocab: int) -> torch.Tensor:
    """The target's embedding table [V, H] the blocks embed their tokens with, or one line saying why there is none."""
    table = features.embed_tokens
    if table is None or table.dim() != 2 or table.shape[0] != target_vocab:
        raise SpecdraftError("DFlash embeds its blocks with the target's embedding table, which this feature source "
                             "does not give whole (a target sharded by train.shard_target=true: set it to false)")
    return table


def block_inputs(draft: DFlashDraft, batch: DraftBatch, anchors: Anchors):
    """-> (block token ids [B, Q] (anchor, then mask ids), block positions [B, Q] (the anchor's rotary position +
    k), context positions [B, T], token columns [B, Q] (anchor + k, clamped into the row))."""
    ids, block = batch.input_ids, draft.block_size
    cols = ids.shape[1]
    columns = block_columns(anchors, block, cols)  # [B, Q]
    offsets = torch.arange(block, device=ids.device).repeat(anchors.positions.shape[1])  # [Q] k of each query
    context_positions = batch.position_ids if batch.position_ids is not None else \
        torch.arange(cols, device=ids.device).expand_as(ids)
    anchor_positions = context_positions.gather(1, anchors.positions).repeat_interleave(block, dim=1)  # [B, Q]
    tokens = torch.where(offsets == 0, ids.gather(1, columns), draft.mask_token_id)
    return tokens, anchor_positions + offsets, context_positions, columns


def position_weights(draft: DFlashDraft, batch: DraftBatch, anchors: Anchors, columns: torch.Tensor,
                     gamma: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """-> (loss weight [B, Q]: exp(-(k - 1) / gamma) where block position k's token is an answer token of its
    anchor's document inside the row, else 0 (the anchor itself: 0); carries [B, Q] bool: the weight's support)."""
    block = draft.block_size
    offsets = torch.arange(block, device=columns.device).repeat(anchors.positions.shape[1])  # [Q]
    anchor_columns = anchors.positions.repeat_interleave(block, dim=1)  # [B, Q]
    answer = (batch.loss_mask * batch.attention_mask).gather(1, columns) > 0
    carries = answer & (offsets > 0) & (anchor_columns + offsets < batch.input_ids.shape[1])
    carries &= anchors.valid.repeat_interleave(block, dim=1)
    if batch.document_ids is not None:
        carries &= batch.document_ids.gather(1, columns) == batch.document_ids.gather(1, anchor_columns)
    decay = torch.exp(-(offsets.float() - 1).clamp(min=0) / gamma)  # [Q]
    return carries.float() * decay, carries


def _head_loss(draft: DFlashDraft, normed: torch.Tensor, teacher_hidden: torch.Tensor, lm_head: torch.Tensor,
               vocab_ids: Optional[torch.Tensor], weights: torch.Tensor):
    """normed, teacher_hidden [N, H]; weights [N] -> (weighted soft cross-entropy sum, draft argmax [N], target
    argmax over the draft vocabulary [N])."""
    draft_logits = draft.logits(normed, lm_head)  # [N, Vd]
    with torch.no_grad():
        head = lm_head if vocab_ids is None else lm_head[vocab_ids]
        teacher = teacher_hidden.to(head.dtype) @ head.T  # [N, Vd]
    loss = soft_cross_entropy(draft_logits, teacher, weights)
    return loss, draft_logits.detach().argmax(-1), teacher.argmax(-1)


def _chunked_head_loss(draft, normed, teacher_hidden, lm_head, vocab_ids, weights):
    """_head_loss over chunks of HEAD_CHUNK_ROWS rows, each checkpointed: no [N, Vd] tensor is kept for the
    backward (the logits are recomputed there, one more head matmul a chunk)."""
    parts = [checkpoint(_head_loss, draft, normed[i:i + HEAD_CHUNK_ROWS], teacher_hidden[i:i + HEAD_CHUNK_ROWS],
                        lm_head, vocab_ids, weights[i:i + HEAD_CHUNK_ROWS], use_reentrant=False)
             for i in range(0, normed.shape[0], HEAD_CHUNK_ROWS)]
    return (sum(p[0] for p in parts), torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts]))


def dflash_loss(draft: DFlashDraft, batch: DraftBatch, cfg: DFlashConfig) -> LossOutput:
    """The blocks' decayed soft cross-entropy (module docstring) and its metrics."""
    feats, block = batch.features, draft.block_size
    embed_table = target_embeddings(feats, feats.lm_head.shape[0])
    candidates = anchor_candidates(batch.loss_mask, batch.attention_mask, batch.document_ids)
    anchors = sample_anchors(candidates, cfg.num_anchors, None if torch.is_grad_enabled() else
                             torch.Generator(device=candidates.device).manual_seed(0))
    tokens, positions, context_positions, columns = block_inputs(draft, batch, anchors)
    context = draft.context(feats.hidden_states)  # [B, T, H]
    mask = block_mask(anchors, block, batch.input_ids.shape[1], batch.document_ids, cfg.attention)
    normed = draft.blocks(F.embedding(tokens, embed_table), positions, context, context_positions, mask)  # [B, Q, H]
    weights, carries = position_weights(draft, batch, anchors, columns, cfg.gamma)  # [B, Q]
    teacher_hidden = feats.final_hidden.gather(  # the target's state at anchor + k - 1, which predicts anchor + k
        1, (columns - 1).clamp(min=0)[..., None].expand(-1, -1, feats.final_hidden.shape[-1]))
    vocab_ids = None if draft.shares_target_head else draft.draft_ids()
    lean = checkpointing_mode(draft.activation_checkpointing) in ("selective", "full") and torch.is_grad_enabled()
    head_loss = _chunked_head_loss if lean else _head_loss
    loss_sum, draft_best, target_best = head_loss(draft, normed.flatten(0, 1), teacher_hidden.flatten(0, 1),
                                                  feats.lm_head, vocab_ids, weights.flatten())
    loss = loss_sum / carries.sum().clamp(min=1)
    with torch.no_grad():
        in_vocab = _in_draft_vocab(draft, feats, columns)  # [B, Q]
        correct = (draft_best.view_as(columns) == target_best.view_as(columns)) & in_vocab & carries
        metrics = _metrics(correct, carries, block)
    metrics["loss"] = loss.detach()
    return LossOutput(loss=loss, metrics=metrics)


def _in_draft_vocab(draft: DFlashDraft, feats: TargetFeatures, columns: torch.Tensor) -> torch.Tensor:
    """[B, Q] whether the target's argmax over its whole vocabulary at each position's teacher column is a draft
    token (always, with the target's own head)."""
    if draft.shares_target_head:
        return torch.ones_like(columns, dtype=torch.bool)
    return feats.argmax_in(draft.t2d).gather(1, (columns - 1).clamp(min=0))


def _metrics(correct: torch.Tensor, carries: torch.Tensor, block: int):
    """correct, carries [B, Q] -> acc@k for k = 1..block-1 and tau_sim, as tensors."""
    correct = correct.view(correct.shape[0], -1, block)[:, :, 1:].float()  # [B, A, Bk - 1]
    carries = carries.view(carries.shape[0], -1, block)[:, :, 1:].float()
    metrics = {f"acc@{k}": (correct[:, :, k - 1].sum() / carries[:, :, k - 1].sum().clamp(min=1))
               for k in range(1, block)}
    run = torch.cumprod(correct, dim=2).sum(dim=2)  # [B, A] accepted positions from k = 1 on
    scored = carries[:, :, 0]  # blocks whose first position carries a loss
    metrics["tau_sim"] = 1.0 + (run * scored).sum() / scored.sum().clamp(min=1)
    return metrics
