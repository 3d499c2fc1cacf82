"""The EAGLE-3 head: `fc` fuses the target's feature layers, one decoder layer (`midlayer`) whose attention reads
[embedding of the next token ; hidden state] (2H wide), the final norm and an LM head over the draft vocabulary.
PosS and other heads build on these classes."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from specdraft.core.types import DraftContext, TargetInfo
from specdraft.kernels.ttt_attention import TTTMask, TTTWindow, ttt_attention
from specdraft.layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin
from specdraft.layers.compile import maybe_compiled
from specdraft.layers.decoder_parts import LayerWeights, attention_inputs, attention_residual, mlp_residual
from specdraft.layers.zero import init_linear_normal_, register_external
from specdraft.methods.eagle3.config import Eagle3Config, eagle3_feature_layers
from specdraft.methods.shared import DraftVocab

KV = Tuple[torch.Tensor, torch.Tensor]  # keys, values: [B, kv_heads, T, D]


class Eagle3Attention(nn.Module):
    """GQA attention over [embedding ; hidden] (2H wide) with the TTT key layout (see module docstring)."""

    def __init__(self, target: TargetInfo):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = target.num_heads, target.num_kv_heads, target.head_dim
        self.rope_theta = target.rope_theta
        width = 2 * target.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, target.hidden_size, bias=False)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:  # [B, T, heads*D] -> [B, heads, T, D]
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def project(self, x: torch.Tensor, positions: torch.Tensor, qkv_weight: torch.Tensor):
        """x [B, Tq, 2H]; positions [Tq] or [B, Tq] rotary positions; qkv_weight [(h + 2 kvh) D, 2H] (q_proj's,
        k_proj's, v_proj's rows) -> rotated q [B, h, Tq, D], rotated k and v [B, kvh, Tq, D]."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        kv_width = self.kv_heads * self.head_dim
        q, k, v = F.linear(x, qkv_weight).split([self.heads * self.head_dim, kv_width, kv_width], dim=-1)
        q = apply_rope(self._split(q, self.heads), cos, sin)  # [B, h, Tq, D]
        k = apply_rope(self._split(k, self.kv_heads), cos, sin)  # [B, kvh, Tq, D]
        return q, k, self._split(v, self.kv_heads)


class Eagle3DecoderLayer(nn.Module):
    """`midlayer`: attention over [norm(embedding) ; norm(hidden)], residual on the hidden state, SwiGLU MLP.

    `checkpointing` (train.activation_checkpointing, set for each unroll by ttt_inputs): from swiglu on, the
    MLP keeps its gate and up projections only; selective recomputes the post-attention norm and MLP in the
    backward. `compiled` (train.compile) runs the parts around the attention call under torch.compile, with
    matmul weights cast outside it (compute_weights; an unroll passes `weights_for` to cast them once)."""

    checkpointing = "none"
    compiled = False
    window: Optional[TTTWindow] = None  # the draft's attention window (Eagle3Draft.share_attention_window): a
    # forward given no mask attends within it

    def __init__(self, target: TargetInfo, intermediate_size: int):
        super().__init__()
        self.input_layernorm = RMSNorm(target.hidden_size, target.rms_norm_eps)
        self.hidden_norm = RMSNorm(target.hidden_size, target.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(target.hidden_size, target.rms_norm_eps)
        self.self_attn = Eagle3Attention(target)
        self.mlp = SwiGLU(target.hidden_size, intermediate_size)
        register_external(self, self.parameters())  # all read in its own forward: LayerWeights, the norms' forward

    def compute_weights(self) -> LayerWeights:
        return LayerWeights(self)

    def forward(self, hidden, embeds, positions, query_cols, cache: List[KV], mask: Optional[TTTMask] = None,
                weights_for=None):
        """hidden, embeds [B, Tq, H]; positions [Tq] or [B, Tq] rotary positions; query_cols [Tq] TTT columns of
        the queries -> new hidden [B, Tq, H] and this step's KV.

        cache[0] holds step-0 keys over columns 0..T0-1 (attended causally by column, within the column's
        document); cache[1:] hold later steps' keys aligned with the queries (attended on the diagonal). `mask`
        (built once per unroll by `ttt_mask`) carries document ids, the window and, for flex attention, the
        block mask; None is one causal document per row, dense, within the layer's `window`. The first call of a chain writes step 0. `weights_for(layer)`
        (specdraft.layers.cast.UnrollCasts) gives the layer's LayerWeights; None casts them for this call."""
        weights = weights_for(self) if weights_for else self.compute_weights()
        q, k, v = maybe_compiled(attention_inputs, self.compiled)(self, hidden, embeds, positions, weights.qkv)
        mask = mask if mask is not None or self.window is None else TTTMask(window=self.window)
        attn = ttt_attention(q, cache + [(k, v)], query_cols, mask)  # [B, h, T, D]
        hidden = maybe_compiled(attention_residual, self.compiled)(hidden, attn, weights.o)
        if self.checkpointing == "selective" and torch.is_grad_enabled():
            return checkpoint(self._recast_mlp_residual, hidden, use_reentrant=False), (k, v)
        return self._mlp_residual(hidden, weights), (k, v)

    def _mlp_residual(self, hidden, weights: LayerWeights):  # [B, T, H] -> [B, T, H]
        return maybe_compiled(mlp_residual, self.compiled)(self, hidden, weights.gate_up, weights.down)

    def _recast_mlp_residual(self, hidden):
        """The MLP with its weights cast here: selective recomputes the casts with it, keeping none."""
        return self._mlp_residual(hidden, self.compute_weights())


class Eagle3Draft(DraftVocab, nn.Module):
    """fc (fusing the feature layers) -> one decoder layer -> final norm -> LM head over the draft vocabulary."""

    def __init__(self, cfg: Eagle3Config, ctx: DraftContext):
        super().__init__()
        target = ctx.target
        self.feature_layers = eagle3_feature_layers(cfg, target)
        vocab = min(cfg.draft_vocab_size, target.vocab_size)
        hidden = target.hidden_size
        self.fc = nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
        self.midlayer = Eagle3DecoderLayer(target, cfg.intermediate_size or target.intermediate_size)
        self.norm = RMSNorm(hidden, target.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.activation_checkpointing = ctx.activation_checkpointing  # none, swiglu, selective, full (or a bool)
        self.compile_layers = ctx.compile
        self.init_draft_vocab(ctx.token_counts, vocab, target.vocab_size)
        init_linear_normal_(self, cfg.init_std)  # gathers ZeRO-3 partitions: zero.Init split them as built
        self.fc_norm = nn.ModuleList([RMSNorm(hidden, target.rms_norm_eps) for _ in self.feature_layers]) \
            if cfg.fc_norm else None  # EAGLE-3.1 (Eagle3Config.fc_norm)
        self.norm_output = cfg.norm_output  # EAGLE-3.1 (Eagle3Config.norm_output)
        self.attention_window = cfg.ttt_window()
        self.share_attention_window()

    def share_attention_window(self) -> None:
        """Every decoder layer of the draft attends within its `attention_window` (a head that adds layers calls this
        after adding them)."""
        for module in self.modules():
            if isinstance(module, Eagle3DecoderLayer):
                module.window = self.attention_window if self.attention_window.size else None

    def step(self, hidden, embeds, positions, query_cols, cache, mask=None, weights_for=None):
        """One draft step: hidden, embeds [B, Tq, H] -> new hidden [B, Tq, H] (pre-norm) and this step's KV.
        Only the states go in positionally: ZeRO-3 wraps each positional tensor of a module call in an autograd
        Function, and the cache alone grows to 2 x 7 tensors by the last TTT step."""
        return self.midlayer(hidden, embeds, positions=positions, query_cols=query_cols, cache=cache, mask=mask,
                             weights_for=weights_for)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, Vd]
        return self.lm_head(self.norm(hidden))

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The feature layers' states joined, aux [..., A*H] -> fc's output [..., H] (with fc_norm: each state
        normed first, EAGLE-3.1), computed in fc's compute dtype."""
        if self.fc_norm is not None:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(aux.to(compute_dtype(self.fc.weight)))

    def fed_back(self, hidden: torch.Tensor) -> torch.Tensor:
        """A step's output [..., H] as the next step reads it: itself, or (norm_output, EAGLE-3.1) after the final
        norm. The LM head reads norm(output) either way."""
        return self.norm(hidden) if self.norm_output else hidden


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer computes in: autocast's where it is on, else the weight's."""
    device = weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def fused_features(draft: Eagle3Draft, hidden_states: Dict[int, torch.Tensor]) -> torch.Tensor:
    """The feature layers' hidden states {i: [B, T, H]} through the draft's fc -> [B, T, H]."""
    aux = torch.cat([hidden_states[i] for i in draft.feature_layers], dim=-1)  # [B, T, 3H]
    return draft.fuse(aux)  # [B, T, H]
