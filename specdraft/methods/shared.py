"""What several methods share below their own packages: the frequency-ranked draft vocabulary (FR-Spec,
arXiv:2502.14856), the digest that names a trained draft's weights (add-ons check which draft they were made
with) and the sequence shift their losses use."""
from __future__ import annotations

import hashlib
from typing import Optional

import torch
from torch import nn

from specdraft.core.types import TargetInfo


def build_draft_vocab(token_counts: torch.Tensor, size: int) -> torch.Tensor:
    """[V] counts -> [size] target ids of the most frequent tokens, ascending (ties: lower id first)."""
    order = torch.sort(-token_counts.to(torch.int64), stable=True).indices
    return torch.sort(order[:size]).values


class DraftVocab(nn.Module):
    """A draft vocabulary as two persistent buffers a draft module carries: `d2t` [Vd] offsets (target id - draft
    id, as SGLang reads them) and `t2d` [V] membership. Methods subclass it (with nn.Module) and call
    `init_draft_vocab` in their constructor."""

    def init_draft_vocab(self, token_counts: Optional[torch.Tensor], draft_vocab: int, target_vocab: int) -> None:
        """Built on the CPU, then placed on the default device (Lightning may build the draft under a CUDA
        default-device context, where the counts still live on the CPU). No counts (a draft about to be loaded):
        the first `draft_vocab` ids, overwritten by the loaded buffers."""
        cpu = torch.device("cpu")
        counts = token_counts.to(cpu) if token_counts is not None else torch.zeros(target_vocab, device=cpu)
        draft_ids = build_draft_vocab(counts, draft_vocab)  # [Vd] target ids
        t2d = torch.zeros(target_vocab, dtype=torch.bool, device=cpu)
        t2d[draft_ids] = True
        device = torch.get_default_device()
        self.register_buffer("d2t", (draft_ids - torch.arange(draft_vocab, device=cpu)).to(device), persistent=True)
        self.register_buffer("t2d", t2d.to(device), persistent=True)

    def draft_ids(self) -> torch.Tensor:  # [Vd] target ids of the draft vocabulary
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)


def draft_digest(draft: nn.Module) -> str:
    """A digest of a draft's weights (names, shapes and values in float32): which draft a record was made with,
    whatever device or dtype it was loaded in."""
    digest = hashlib.sha256()
    for name, tensor in sorted(draft.state_dict().items()):
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, t] <- x[:, t + n], zero-filled at the end. [B, T, ...] -> [B, T, ...]."""
    if n == 0:
        return x
    return torch.cat([x[:, n:], torch.zeros_like(x[:, :n])], dim=1)


class GQAProjections(nn.Module):
    """The q/k/v/o projections of a draft attention with the target's head geometry (grouped-query, no bias), and
    that geometry (heads, kv_heads, head_dim, rope_theta): the base of a method's own attention."""

    def __init__(self, target: TargetInfo):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = target.num_heads, target.num_kv_heads, target.head_dim
        self.rope_theta = target.rope_theta
        hidden = target.hidden_size
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)


# ---- training FLOPs (MethodSpec.train_flops) ------------------------------------------------------------------------
BACKWARD = 3
"""A trained matmul's forward and backward cost about three forwards."""


def layer_matmul_flops(target: TargetInfo, input_width: int, intermediate: int) -> float:
    """Forward FLOPs a row of one draft decoder layer's matmuls: q, k and v from an `input_width`-wide input, the
    output projection, and the gated MLP `intermediate` wide (the target's head geometry)."""
    q_width, kv_width = target.num_heads * target.head_dim, target.num_kv_heads * target.head_dim
    hidden = target.hidden_size
    return 2 * input_width * (q_width + 2 * kv_width) + 2 * q_width * hidden + 6 * hidden * intermediate


def attention_flops(target: TargetInfo, keys: float) -> float:
    """Forward FLOPs of a query row's attention over `keys` keys (QK^T and PV)."""
    return 4 * target.num_heads * target.head_dim * keys


def causal_keys(seq_len: int, window: int = 0, sinks: int = 0) -> float:
    """Keys a query attends to on average in a causal sequence of `seq_len` tokens: (T + 1) / 2, or under a sliding
    window of `window` keys (with `sinks` first ones kept beside it) the window's share of that."""
    if not window or window >= seq_len:
        return (seq_len + 1) / 2
    inside = window * (window + 1) / 2 + (seq_len - window) * (window + min(sinks, seq_len - window))
    return inside / seq_len
