"""ViSpec's training: the batch in the draft's own sequence (each image's span replaced by its stand-ins, its other
columns dropped; every column keeps its position id, reads the embedding of the token after its position, as the
runtime's drafter does, and the global feature of the latest image before it), then EAGLE-3's training-time test
over it, the draft fed back its own states (its loss, specdraft.methods.eagle3.loss, with this unroll: stand-ins in
step 0, img_fc before every step)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Dict, Optional

import torch

from specdraft.core.types import IMAGE_EMBEDS, IMAGE_MASK, DraftBatch, LossOutput, TargetFeatures
from specdraft.methods.eagle3 import eagle3_loss, ttt_inputs
from specdraft.methods.vispec.config import VispecConfig
from specdraft.methods.vispec.model import VispecDraft, image_inputs, kept_columns, take_columns


@dataclass
class DraftColumns:
    """A batch in the draft's sequence: the compressed batch, and what each of its columns reads of the images."""

    batch: DraftBatch  # input_ids, masks, features and position ids (the target's) at the kept columns [B, T'],
    # then padding (T' = T: the batch keeps its width); hidden_states[0] is shifted (`_next_token_embeds`)
    standin_mask: torch.Tensor  # [B, T'] bool: the column stands in for an image
    standins: torch.Tensor  # [B, T', H] its stand-in (zeros where none)
    global_features: torch.Tensor  # [B, T', H] the global feature of the latest image before it (zeros if none)


def _next_token_embeds(embeds: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """embeds [B, T, H] (the embeddings of the batch's tokens), index [B, T'] (the kept positions) -> [B, T', H]
    whose column c + 1 holds the embedding of the token after kept position c: the training-time test's step 0
    pairs column c with column c + 1's embedding, and a dropped span must not change which token that is (the
    runtime's drafter reads each position's next token)."""
    after_previous = torch.cat([index[:, :1], index[:, :-1] + 1], dim=1).clamp(max=embeds.shape[1] - 1)  # [B, T']
    return take_columns(embeds, after_previous)


def _take_features(features: TargetFeatures, index: torch.Tensor) -> TargetFeatures:
    hidden_states: Dict[int, torch.Tensor] = {i: take_columns(h, index) for i, h in features.hidden_states.items()}
    hidden_states[0] = _next_token_embeds(features.hidden_states[0], index)
    final_hidden = None if features.final_hidden is None else take_columns(features.final_hidden, index)
    return replace(features, hidden_states=hidden_states, final_hidden=final_hidden, context={})


def draft_columns(draft: VispecDraft, batch: DraftBatch) -> DraftColumns:
    """The batch's columns as the draft sees them. A batch without image context (a text target's) is as it is,
    with no stand-ins and zero global features. In training every global feature carries the adaptor's anchor
    (a zero that keeps the adaptor in the graph of a batch without images)."""
    features, (rows, width) = batch.features, batch.input_ids.shape
    embeds = features.hidden_states[0]  # [B, T, H]
    anchor = draft.adaptor_anchor(embeds) if torch.is_grad_enabled() else 0.0
    if IMAGE_MASK not in features.context:
        zeros = embeds.new_zeros(rows, width, embeds.shape[-1])
        return DraftColumns(batch, torch.zeros_like(batch.input_ids, dtype=torch.bool), zeros, zeros + anchor)
    maps, standins, global_features = image_inputs(draft, features.context[IMAGE_EMBEDS], features.context[IMAGE_MASK])
    index, valid = kept_columns(maps.kept, width)  # [B, T]: the batch's width kept (the shapes a GPU has planned)
    positions = batch.position_ids if batch.position_ids is not None else \
        torch.arange(width, device=index.device).expand(rows, -1)
    taken = DraftBatch(input_ids=take_columns(batch.input_ids, index),
                       loss_mask=take_columns(batch.loss_mask, index) * valid,
                       attention_mask=take_columns(batch.attention_mask, index) * valid,
                       features=_take_features(features, index), position_ids=take_columns(positions, index),
                       document_ids=None if batch.document_ids is None else take_columns(batch.document_ids, index))
    return DraftColumns(taken, take_columns(maps.standin >= 0, index) & valid, take_columns(standins, index),
                        take_columns(global_features, index) + anchor)


def vispec_unroll(draft: VispecDraft, hidden_states, steps: int, position_ids=None, document_ids=None,
                  attention: str = "auto", logits: bool = True, columns: Optional[DraftColumns] = None):
    """EAGLE-3's unroll (specdraft.methods.eagle3.ttt) over the draft's columns: step 0's hidden state is the
    stand-in at a stand-in column, else img_fc(fc(features), global feature); every later step's is img_fc(the
    step before's output, global feature). Yields each step's logits [B, T', Vd] (or hidden state, logits=False)."""
    ttt = ttt_inputs(draft, hidden_states, steps, position_ids, document_ids, attention)
    global_features = columns.global_features
    hidden = draft.with_image(ttt.fused, global_features)  # [B, T', H]
    hidden = torch.where(columns.standin_mask[..., None], columns.standins.to(hidden.dtype), hidden)
    cache = []
    for step in range(steps):
        if step:
            hidden = draft.with_image(hidden, global_features)
        hidden, kv = ttt.run_step(hidden, ttt.embeds(step + 1), ttt.positions + step, ttt.cols, cache, mask=ttt.mask)
        cache.append(kv)
        yield draft.logits(hidden) if logits else hidden


def vispec_loss(draft: VispecDraft, batch: DraftBatch, cfg: VispecConfig) -> LossOutput:
    """EAGLE-3's loss and metrics (soft cross-entropy over the unroll, acc@k, tau_sim) on the draft's columns."""
    columns = draft_columns(draft, batch)
    return eagle3_loss(draft, columns.batch, cfg, unroll=functools.partial(vispec_unroll, columns=columns))
