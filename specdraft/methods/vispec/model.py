"""The ViSpec draft: EAGLE-3's head with an image adaptor and `img_fc`, and where each image goes in its sequence.

Image adaptor: `num_queries` learned queries attend over one image's token embeddings (the image features the
target's projector made: IMAGE_EMBEDS' rows on the image's span, RMS-normed). The first num_queries - 1 outputs
stand in for the image's span in the draft's sequence, at the span's last columns (keeping their position ids); the
span's other columns are dropped from the draft's sequence. The last output is the image's global feature. img_fc
(2H -> H) joins the global feature of the latest image before a column (zeros before any) with every hidden state
the decoder layer reads, the draft's own fed-back states included; it starts as [I | 0], so that a fresh draft is
EAGLE-3's.

A draft column pairs the target's features at position t with the embedding of token t + 1 (EAGLE's pairing), so,
as in ViSpec, an image's span in the draft's sequence is the columns whose next token is one of the image's: target
positions start - 1 .. end - 2. The column at the image's last position (the target's state after reading the whole
image, with the first token after it) is a text column, reading the image's global feature.

`column_maps` says, in the target's positions, which columns the draft keeps and what each reads of the images; the
loss compresses a batch with it (specdraft.methods.vispec.loss), the runtime's drafter fills its per-slot tables
with it (specdraft.methods.vispec.drafter).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.core.types import DraftContext
from specdraft.layers import RMSNorm
from specdraft.layers.zero import gathered, init_linear_normal_
from specdraft.methods.eagle3 import Eagle3Draft
from specdraft.methods.vispec.config import VispecConfig


class ImageAdaptor(nn.Module):
    """`num_queries` learned queries, multi-head cross-attention over an image's normed token embeddings."""

    def __init__(self, hidden: int, heads: int, num_queries: int, eps: float):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.queries = nn.Parameter(torch.randn(num_queries, heads * self.head_dim) * self.head_dim ** -0.5)
        self.norm = RMSNorm(hidden, eps)
        self.k_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # [S, N, h d] -> [S, h, N, d]
        return x.view(*x.shape[:2], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, embeds: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """embeds [S, N, H] (S images, padded to N tokens), valid [S, N] bool -> [S, num_queries, H]."""
        x = self.norm(embeds)
        k, v = self._split(self.k_proj(x)), self._split(self.v_proj(x))  # [S, h, N, d]
        q = self._split(self.queries.to(k.dtype).expand(embeds.shape[0], -1, -1))  # [S, h, Q, d]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])  # [S, h, Q, d]
        return self.o_proj(attended.transpose(1, 2).flatten(2))  # [S, Q, H]


class VispecDraft(Eagle3Draft):
    """EAGLE-3's head (fc, midlayer, norm, LM head over the draft vocabulary) + image_adaptor + img_fc."""

    def __init__(self, cfg: VispecConfig, ctx: DraftContext):
        super().__init__(cfg, ctx)
        target = ctx.target
        self.num_queries = cfg.num_queries
        self.image_adaptor = ImageAdaptor(target.hidden_size, target.num_heads, cfg.num_queries, target.rms_norm_eps)
        self.img_fc = nn.Linear(2 * target.hidden_size, target.hidden_size, bias=False)
        init_linear_normal_(self.image_adaptor, cfg.init_std)
        with gathered([self.img_fc.weight]), torch.no_grad():  # [I | 0]: hidden states pass through at first
            self.img_fc.weight.zero_()
            self.img_fc.weight[:, :target.hidden_size].copy_(torch.eye(target.hidden_size))

    def with_image(self, hidden: torch.Tensor, global_features: torch.Tensor) -> torch.Tensor:
        """hidden [..., H], the global feature of the latest image before each row [..., H] -> [..., H]."""
        return self.img_fc(torch.cat([hidden, global_features.to(hidden.dtype)], dim=-1))

    def adaptor_anchor(self, embeds: torch.Tensor) -> torch.Tensor:
        """A zero [] that depends on every adaptor weight (its run over one row of `embeds` [B, T, H], times 0): a
        training batch without images still takes the adaptor into its graph, with zero gradients, as DDP and
        ZeRO, which reduce every parameter's gradient, need."""
        valid = torch.ones(1, 1, dtype=torch.bool, device=embeds.device)
        return 0.0 * self.image_adaptor(embeds[:1, :1].to(self.fc.weight.dtype), valid).sum()

    def adapt(self, image_embeds: torch.Tensor, spans: "ImageSpans") -> torch.Tensor:
        """image_embeds [B, T, H] (IMAGE_EMBEDS), the images' spans -> the adaptor's outputs [S, Q, H]."""
        longest = int((spans.ends - spans.starts).max()) if spans.count else 1
        offsets = torch.arange(longest, device=image_embeds.device)  # [N]
        columns = (spans.starts[:, None] + offsets).clamp(max=image_embeds.shape[1] - 1)  # [S, N]
        valid = offsets < (spans.ends - spans.starts)[:, None]  # [S, N]
        embeds = image_embeds[spans.rows[:, None], columns]  # [S, N, H]
        return self.image_adaptor(embeds.to(self.fc.weight.dtype), valid)


@dataclass
class ImageSpans:
    """The contiguous runs of image tokens in a batch (each one image, or one tile of one), in row-major order."""

    rows: torch.Tensor  # [S] batch row
    starts: torch.Tensor  # [S] first position
    ends: torch.Tensor  # [S] one past the last position

    @property
    def count(self) -> int:
        return int(self.rows.shape[0])


def image_spans(image_mask: torch.Tensor) -> ImageSpans:
    """image_mask [B, T] bool -> its runs of True (one read to the host)."""
    edges = torch.diff(F.pad(image_mask.to(torch.int8), (1, 1)), dim=1)  # [B, T + 1]: +1 at a start, -1 past an end
    starts, ends = (edges == 1).nonzero(), (edges == -1).nonzero()  # row-major: the k-th start pairs the k-th end
    return ImageSpans(rows=starts[:, 0], starts=starts[:, 1], ends=ends[:, 1])


@dataclass
class ColumnMaps:
    """What each target position is to the draft (the adaptor's outputs of image s are rows s * Q .. s * Q + Q - 1
    of their flattening; -1 means none)."""

    kept: torch.Tensor  # [B, T] bool: the position has a column in the draft's sequence (text, or a stand-in)
    standin: torch.Tensor  # [B, T] long: the adaptor output standing in for this image position
    global_feature: torch.Tensor  # [B, T] long: the global feature (adaptor output) of the latest image before it


def column_maps(image_mask: torch.Tensor, spans: ImageSpans, num_queries: int) -> ColumnMaps:
    """image_mask [B, T] and its spans -> ColumnMaps. An image's columns are the positions whose next token is one
    of its tokens (start - 1 .. end - 2; the module's docstring says why); of them, the last min(Q - 1, count) are
    stand-ins, outputs 0..Q-2 of the adaptor in order (fewer columns than Q - 1 take the last outputs), the others
    are dropped; every position from end - 1 on reads the image's global feature (output Q - 1), until the next
    image's columns end."""
    stand = num_queries - 1
    standin = torch.full(image_mask.shape, -1, dtype=torch.long, device=image_mask.device)
    global_feature = torch.full_like(standin, -1)
    dropped = torch.zeros_like(image_mask)
    for index, (row, start, end) in enumerate(zip(*(t.tolist() for t in (spans.rows, spans.starts, spans.ends)))):
        first_column, end_column = max(start - 1, 0), end - 1
        dropped[row, first_column:end_column] = True
        count = min(stand, end_column - first_column)
        first = index * num_queries
        standin[row, end_column - count:end_column] = torch.arange(first + stand - count, first + stand,
                                                                   device=standin.device)
        global_feature[row, end_column:] = first + stand
    return ColumnMaps(kept=~dropped | (standin >= 0), standin=standin, global_feature=global_feature)


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table [R, H] (R >= 0 rows), index [...] long (-1: none) -> [..., H], zeros where none."""
    if table.shape[0] == 0:
        return table.new_zeros(*index.shape, table.shape[-1])
    picked = table[index.clamp(min=0)]
    return picked * (index >= 0).unsqueeze(-1).to(picked.dtype)


def image_inputs(draft: VispecDraft, image_embeds: torch.Tensor,
                 image_mask: torch.Tensor) -> Tuple[ColumnMaps, torch.Tensor, torch.Tensor]:
    """IMAGE_EMBEDS [B, T, H], IMAGE_MASK [B, T] -> (ColumnMaps, stand-in [B, T, H], global feature [B, T, H]),
    each position's (zeros where none)."""
    spans = image_spans(image_mask)
    maps = column_maps(image_mask, spans, draft.num_queries)
    adapted = draft.adapt(image_embeds, spans).flatten(0, 1) if spans.count else \
        image_embeds.new_zeros(0, image_embeds.shape[-1]).to(draft.fc.weight.dtype)  # [S * Q, H]
    return maps, gather_rows(adapted, maps.standin), gather_rows(adapted, maps.global_feature)


def kept_columns(kept: torch.Tensor, width: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """kept [B, T] bool -> (index [B, W] of the kept positions in order, each row's first, padded with 0;
    valid [B, W] bool). W: `width` (at least the most any row keeps), else that most."""
    counts = kept.sum(1)  # [B]
    width = width or max(int(counts.max()), 1)
    order = torch.sort((~kept).to(torch.int8), dim=1, stable=True).indices[:, :width]  # kept positions first
    valid = torch.arange(width, device=kept.device) < counts[:, None]  # [B, W]
    return torch.where(valid, order, torch.zeros_like(order)), valid


def take_columns(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...] -> [B, T', ...] at index [B, T']."""
    expanded = index.view(*index.shape, *([1] * (x.dim() - 2))).expand(*index.shape, *x.shape[2:])
    return torch.gather(x, 1, expanded)

