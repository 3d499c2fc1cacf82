"""EAGLE-3 draft head (Li et al., "EAGLE-3: Scaling up Inference Acceleration of LLMs via Training-Time Test",
arXiv:2503.01840), with a frequency-ranked draft vocabulary (FR-Spec, arXiv:2502.14856).

The head fuses three target hidden states (low, mid, high) with `fc`, runs one decoder layer whose attention
input is [embedding of the next token ; hidden state] (2H wide), and predicts the token after next over a draft
vocabulary of the most frequent answer tokens.

Feature layers: `feature_layers` are indices into the target's hidden-state stack, where index i is the *input*
of decoder layer i (index 0 = token embeddings). EAGLE's convention is the inputs of layers 2, L/2 and L-3
(for SmolLM2, L=30: 2, 15, 27). SGLang and vLLM name the same states by the layer that *outputs* them, so the
exports write `eagle_aux_hidden_state_layer_ids = [i - 1 for i in feature_layers]`.

Training-time test (TTT), columns t = 0..T-1 of a sequence x:
  step 0: hidden = fc(target features at t), token x[t+1]  -> predicts x[t+2]
  step j: hidden = step j-1's output at t,  token x[t+1+j] -> predicts x[t+2+j]
Step j at column t stands for sequence position t + j, so its rotary position is t + j, and it attends to the
step-0 keys of columns <= t plus the keys that steps 1..j wrote at column t: exactly what the draft sees at
inference after drafting j tokens. The loss at step j is the soft cross-entropy against the target's
distribution over the draft vocabulary at position t+1+j, weighted by `step_loss_decay ** j`.

Packed rows (several conversations per row, `data.pack_length`): positions restart at each conversation, keys
are seen only within the column's conversation, and a column predicts only tokens of its own conversation, so
the loss equals that of the conversations in separate rows. The attention runs on flex attention with a block
mask on CUDA and densely elsewhere (specdraft/kernels/ttt_attention); the loss is the fused soft cross-entropy
(specdraft/kernels/soft_ce).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from specdraft.errors import SpecdraftError, choices_error
from specdraft.kernels.soft_ce import soft_cross_entropy
from specdraft.kernels.ttt_attention import IMPLS as ATTENTION_IMPLS
from specdraft.kernels.ttt_attention import TTTMask, ttt_attention, ttt_mask
from specdraft.config import checkpointing_mode
from specdraft.layers import RMSNorm, SwiGLU, apply_rope, rope_cos_sin
from specdraft.layers.cast import UnrollCasts
from specdraft.layers.decoder_parts import (
    LayerWeights,
    RuntimeWeights,
    attention_inputs,
    attention_residual,
    fused_norm,
    layer_query,
    layer_tail,
    mlp_residual,
)
from specdraft.layers.compile import maybe_compiled
from specdraft.layers.zero import init_linear_normal_, register_external
from specdraft.methods.base import (
    ChainState,
    DraftBatch,
    DraftContext,
    ExportFormat,
    LossOutput,
    MethodSpec,
    TargetFeatures,
    TargetInfo,
)
from specdraft.runtime.drafter import draft_attention, ingest_attention, ingest_slots, rope_tables

KV = Tuple[torch.Tensor, torch.Tensor]  # keys, values: [B, kv_heads, T, D]


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

    def __post_init__(self):
        if self.ttt_steps < 1:
            raise SpecdraftError(f"method.ttt_steps must be >= 1, got {self.ttt_steps}")
        if not 0.0 < self.step_loss_decay <= 1.0:
            raise SpecdraftError(f"method.step_loss_decay must be in (0, 1], got {self.step_loss_decay}")
        if self.attention not in ATTENTION_IMPLS:
            raise choices_error("method.attention", self.attention, ATTENTION_IMPLS)


def eagle3_feature_layers(cfg: Eagle3Config, target: TargetInfo) -> List[int]:
    layers = cfg.feature_layers or [2, target.num_layers // 2, target.num_layers - 3]
    bad = [i for i in layers if not 0 < i < target.num_layers]
    if bad:
        raise SpecdraftError(f"method.feature_layers {bad} out of range; valid: 1..{target.num_layers - 1}")
    return list(layers)


def build_draft_vocab(token_counts: torch.Tensor, size: int) -> torch.Tensor:
    """[V] counts -> [size] target ids of the most frequent tokens, ascending (ties: lower id first)."""
    order = torch.sort(-token_counts.to(torch.int64), stable=True).indices
    return torch.sort(order[:size]).values


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
        (built once per unroll by `ttt_mask`) carries document ids and, for flex attention, the block mask;
        None is one causal document per row, dense. The first call of a chain writes step 0. `weights_for(layer)`
        (specdraft.layers.cast.UnrollCasts) gives the layer's LayerWeights; None casts them for this call."""
        weights = weights_for(self) if weights_for else self.compute_weights()
        q, k, v = maybe_compiled(attention_inputs, self.compiled)(self, hidden, embeds, positions, weights.qkv)
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


class Eagle3Draft(nn.Module):
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
        self.register_buffer("d2t", torch.empty(0, dtype=torch.long), persistent=True)
        self.register_buffer("t2d", torch.empty(0, dtype=torch.bool), persistent=True)
        self._set_vocab(ctx.token_counts, vocab, target.vocab_size)
        init_linear_normal_(self, cfg.init_std)  # gathers ZeRO-3 partitions: zero.Init split them as built

    def _set_vocab(self, token_counts: Optional[torch.Tensor], draft_vocab: int, target_vocab: int) -> None:
        """d2t [Vd] offsets (target id - draft id, as SGLang reads them) and t2d [V] membership mask.

        Built on the CPU, then placed on the default device (Lightning may build the draft under a CUDA
        default-device context, where the counts still live on the CPU)."""
        cpu = torch.device("cpu")
        counts = token_counts.to(cpu) if token_counts is not None else torch.zeros(target_vocab, device=cpu)
        draft_ids = build_draft_vocab(counts, draft_vocab)  # [Vd] target ids
        t2d = torch.zeros(target_vocab, dtype=torch.bool, device=cpu)
        t2d[draft_ids] = True
        device = torch.get_default_device()
        self.d2t = (draft_ids - torch.arange(draft_vocab, device=cpu)).to(device)
        self.t2d = t2d.to(device)

    def draft_ids(self) -> torch.Tensor:  # [Vd] target ids of the draft vocabulary
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)

    def step(self, hidden, embeds, positions, query_cols, cache, mask=None, weights_for=None):
        """One draft step: hidden, embeds [B, Tq, H] -> new hidden [B, Tq, H] (pre-norm) and this step's KV.
        Only the states go in positionally: ZeRO-3 wraps each positional tensor of a module call in an autograd
        Function, and the cache alone grows to 2 x 7 tensors by the last TTT step."""
        return self.midlayer(hidden, embeds, positions=positions, query_cols=query_cols, cache=cache, mask=mask,
                             weights_for=weights_for)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, Vd]
        return self.lm_head(self.norm(hidden))


def _shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, t] <- x[:, t + n], zero-filled at the end. [B, T, ...] -> [B, T, ...]."""
    if n == 0:
        return x
    return torch.cat([x[:, n:], torch.zeros_like(x[:, :n])], dim=1)


def _padded_rows(x: torch.Tensor, pad: int) -> torch.Tensor:
    """[B, T, ...] -> [B*T + pad, ...]: the rows flattened, then `pad` zero rows (room for shifted views)."""
    flat = x.flatten(0, 1)
    return torch.cat([flat, flat.new_zeros(pad, *flat.shape[1:])])


def _shifted(rows: torch.Tensor, shift: int, shape: torch.Size) -> torch.Tensor:
    """A view of `rows` (from _padded_rows) as [B, T, ...] where column t holds row t + shift.

    Unlike _shift_left, the last `shift` columns of a batch row read the next row's first ones: those columns
    predict tokens past the row's end and carry no loss, and attention never carries them to earlier columns."""
    return rows[shift: shift + shape[0] * shape[1]].view(*shape[:2], *rows.shape[1:])


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer computes in: autocast's where it is on, else the weight's."""
    device = weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def _fused_features(draft: Eagle3Draft, hidden_states: Dict[int, torch.Tensor]) -> torch.Tensor:
    aux = torch.cat([hidden_states[i] for i in draft.feature_layers], dim=-1)  # [B, T, 3H]
    return draft.fc(aux.to(_compute_dtype(draft.fc.weight)))  # [B, T, H]


def draft_checkpointing(draft) -> str:
    """The draft's activation checkpointing mode for this forward (CHECKPOINTING): none without autograd."""
    if not torch.is_grad_enabled():
        return "none"
    return checkpointing_mode(getattr(draft, "activation_checkpointing", "none"))


def _configure_layers(draft, mode: str) -> None:
    """Every Eagle3DecoderLayer of the draft (PosS: each specialist) runs this unroll with `mode` and, when the
    draft asks for it (compile_layers), its compiled parts."""
    compiled = bool(getattr(draft, "compile_layers", False))
    for module in draft.modules():
        if isinstance(module, Eagle3DecoderLayer):
            module.checkpointing, module.compiled = mode, compiled


def _checkpointed(step):
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
        return _shifted(self.embeds_rows, shift, self.shape)


def ttt_inputs(draft, hidden_states: Dict[int, torch.Tensor], steps: int, position_ids=None, document_ids=None,
               attention: str = "auto", checkpointed=None) -> TTTInputs:
    """`checkpointed(step)` wraps draft.step for full activation checkpointing (default: this module's); the
    lighter modes act inside the decoder layers, which this sets up for the unroll."""
    embeds_all = hidden_states[0]  # [B, T, H] target embeddings of x
    batch, num_cols = embeds_all.shape[:2]
    cols = torch.arange(num_cols, device=embeds_all.device)
    mode = draft_checkpointing(draft)
    _configure_layers(draft, mode)
    run_step = (checkpointed or _checkpointed)(draft.step) if mode == "full" else \
        functools.partial(draft.step, weights_for=UnrollCasts())
    fused = _fused_features(draft, hidden_states)
    return TTTInputs(fused=fused, embeds_rows=_padded_rows(embeds_all.to(fused.dtype), steps),
                     shape=embeds_all.shape, cols=cols,
                     positions=cols if position_ids is None else position_ids,
                     mask=ttt_mask(document_ids, batch, num_cols, embeds_all.device, attention), run_step=run_step)


def ttt_unroll(draft: Eagle3Draft, hidden_states: Dict[int, torch.Tensor], steps: int,
               position_ids: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
               attention: str = "auto", logits: bool = True):
    """Training-time test: yields each step's draft logits [B, T, Vd]; column t of step j predicts x[t+2+j].

    position_ids, document_ids [B, T] describe packed rows (positions restart at each document; attention stays
    within it); None is one document per row. `attention`: see specdraft.kernels.ttt_attention.ttt_mask.
    logits=False yields each step's hidden state [B, T, H] instead (draft.logits of it are the logits)."""
    ttt = ttt_inputs(draft, hidden_states, steps, position_ids, document_ids, attention)
    hidden, cache = ttt.fused, []
    for step in range(steps):
        hidden, kv = ttt.run_step(hidden, ttt.embeds(step + 1), ttt.positions + step, ttt.cols, cache, mask=ttt.mask)
        cache.append(kv)
        yield draft.logits(hidden) if logits else hidden


def _same_document(document_ids: Optional[torch.Tensor], shift: int):
    """[B, T] 1 where column t + shift lies in column t's document (1 everywhere for unpacked rows)."""
    if document_ids is None:
        return 1.0
    return (_shift_left(document_ids, shift) == document_ids).float()


def _teacher_rows(features: TargetFeatures, vocab_ids: torch.Tensor, pad: int) -> torch.Tensor:
    """The target's logits over the draft vocabulary, rows flattened, `pad` zero rows after: [B*T + pad, Vd].

    Computed once per batch; each TTT step reads a shifted view of it (no per-step copies)."""
    return _padded_rows(features.logits_for(vocab_ids), pad)


def _head_loss(draft: Eagle3Draft, hidden: torch.Tensor, target_rows: torch.Tensor, row_weights: torch.Tensor):
    """One TTT step's LM head and soft cross-entropy: hidden [B, T, H], target_rows [B*T, Vd], row_weights
    [B*T] -> (weighted loss sum, draft argmax [B, T])."""
    draft_logits = draft.logits(hidden)  # [B, T, Vd]
    loss = soft_cross_entropy(draft_logits.flatten(0, 1), target_rows, row_weights)
    return loss, draft_logits.detach().argmax(-1)


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
    teacher = _teacher_rows(feats, draft.draft_ids(), cfg.ttt_steps + 1)  # [B*T + K + 1, Vd] target's dtype
    teacher_best = teacher.argmax(-1)  # [B*T + K + 1]
    in_vocab_all = feats.argmax_in(draft.t2d)  # [B, T]
    valid_all = (batch.loss_mask * batch.attention_mask).float()  # [B, T]
    loss = torch.zeros((), device=valid_all.device)
    metrics, chain_alive, chain_len = {}, None, torch.zeros_like(valid_all)
    steps = unroll(draft, feats.hidden_states, cfg.ttt_steps, batch.position_ids, batch.document_ids,
                   cfg.attention, logits=False)
    head_loss = _checkpointed_head_loss if draft_checkpointing(draft) in ("selective", "full") else _head_loss
    for step, hidden in enumerate(steps):
        target_rows = teacher[step + 1: step + 1 + valid_all.numel()]  # [B*T, Vd] the target's view at t+1+step
        in_vocab = _shift_left(in_vocab_all, step + 1)
        # the predicted token x[t+2+step] is an answer token of column t's document
        mask = _shift_left(valid_all, step + 2) * _same_document(batch.document_ids, step + 2)
        loss_mask = mask * in_vocab  # [B, T]
        step_loss, draft_best = head_loss(draft, hidden, target_rows, loss_mask.flatten())
        loss = loss + cfg.step_loss_decay ** step * step_loss / loss_mask.sum().clamp(min=1)
        with torch.no_grad():
            target_best = _shifted(teacher_best, step + 1, shape)  # [B, T]
            correct = (draft_best == target_best) & in_vocab & (mask > 0)
            metrics[f"acc@{step + 1}"] = (correct.float() * mask).sum() / mask.sum().clamp(min=1)
            chain_alive = correct if chain_alive is None else chain_alive & correct
            chain_len = chain_len + chain_alive.float()
    first_mask = _shift_left(valid_all, 2) * _same_document(batch.document_ids, 2)
    metrics["tau_sim"] = 1.0 + (chain_len * first_mask).sum() / first_mask.sum().clamp(min=1)
    metrics["loss"] = loss.detach()
    return LossOutput(loss=loss, metrics=metrics)


@torch.no_grad()
def eagle3_propose(draft: Eagle3Draft, state: ChainState, num_tokens: int) -> torch.Tensor:
    """Greedy chain of `num_tokens` target-vocabulary ids drafted after state.tokens (batch 1) -> [k]."""
    hidden = _fused_features(draft, state.features.hidden_states)  # [1, n, H]
    n = hidden.shape[1]
    cols = torch.arange(n, device=hidden.device)
    embeds = state.embed(state.tokens[:, 1:]).to(hidden.dtype)  # column t sees token t+1
    hidden, kv = draft.step(hidden, embeds, cols, cols, [])
    cache, last_col = [kv], cols[-1:]
    hidden = hidden[:, -1:]  # [1, 1, H]
    drafted = []
    for step in range(num_tokens):
        draft_index = draft.logits(hidden)[0, -1].argmax()
        token = draft_index + draft.d2t[draft_index]
        drafted.append(token)
        if step + 1 == num_tokens:
            break
        embeds = state.embed(token.view(1, 1)).to(hidden.dtype)
        hidden, kv = draft.step(hidden, embeds, last_col + step + 1, last_col, cache)
        cache.append(kv)
    return torch.stack(drafted)


def _hf_config(draft: Eagle3Draft, cfg: Eagle3Config, target: TargetInfo, provenance: Dict[str, Any]):
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target.hidden_size,
        "intermediate_size": draft.midlayer.mlp.gate_proj.out_features,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": draft.lm_head.out_features,
        "max_position_embeddings": target.max_position_embeddings,
        "rope_theta": target.rope_theta,
        "rope_scaling": target.rope_scaling,
        "tie_word_embeddings": False,
        "bos_token_id": target.bos_token_id,
        "eos_token_id": target.eos_token_id,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in draft.feature_layers],
            "use_aux_hidden_state": True,
        },
        "specdraft": {"method": "eagle3", "method_config": asdict(cfg), **provenance},
    }


def eagle3_to_hf(draft: Eagle3Draft, cfg: Eagle3Config, target: TargetInfo, provenance: Dict[str, Any]):
    """SGLang's LlamaForCausalLMEagle3 layout: midlayer.*, fc, norm, lm_head, d2t, t2d; no embed_tokens."""
    tensors = {name: tensor.detach() for name, tensor in draft.state_dict().items()}
    return _hf_config(draft, cfg, target, provenance), tensors


def eagle3_hf_keys(draft: Eagle3Draft, target: TargetInfo) -> List[str]:
    return ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
            "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
            *[f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"],
            *[f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]]


def eagle3_to_speculators(draft: Eagle3Draft, cfg: Eagle3Config, target: TargetInfo, provenance: Dict[str, Any]):
    """The `speculators` layout that vLLM reads: layers.0.* instead of midlayer.*, a speculators_config, and
    aux layer ids counted as vLLM does (index i = input of layer i, our own convention)."""
    hf_config, tensors = eagle3_to_hf(draft, cfg, target, provenance)
    layer_config = {k: hf_config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                                                "vocab_size", "max_position_embeddings", "rope_theta",
                                                "rope_scaling", "bos_token_id", "eos_token_id")}
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1, **layer_config},
        "draft_vocab_size": hf_config["draft_vocab_size"],
        "target_hidden_size": target.hidden_size,
        "norm_before_residual": False,
        "eagle_aux_hidden_state_layer_ids": list(draft.feature_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.ttt_steps,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": provenance.get("target", target.name_or_path),
                         "architectures": list(target.architectures)},
        },
        "torch_dtype": "bfloat16",
        "specdraft": hf_config["specdraft"],
    }
    return config, {k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items()}


def eagle3_speculators_keys(draft: Eagle3Draft, target: TargetInfo) -> List[str]:
    return [k.replace("midlayer.", "layers.0.", 1) for k in eagle3_hf_keys(draft, target)]


def eagle3_from_export(config: Dict[str, Any], tensors: Dict[str, torch.Tensor], target: TargetInfo):
    """Rebuild a draft from an `hf` export (ours, or any SGLang-style EAGLE-3 checkpoint for this target)."""
    saved = (config.get("specdraft") or {}).get("method_config") or {}
    aux_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    cfg = Eagle3Config(**saved) if saved else Eagle3Config(
        draft_vocab_size=config["draft_vocab_size"], intermediate_size=config.get("intermediate_size"),
        feature_layers=[i + 1 for i in aux_ids] if aux_ids else None)
    draft = Eagle3Draft(cfg, DraftContext(target=target))
    tensors = {k.replace("layers.0.", "midlayer.", 1): v for k, v in tensors.items()}  # speculators names
    draft.load_state_dict({k: v for k, v in tensors.items() if k in draft.state_dict()}, strict=True)
    return cfg, draft


def eagle3_source(cfg: Eagle3Config, ctx: DraftContext, feature_layers: List[int], what: str) -> Eagle3Draft:
    """The EAGLE-3 draft `cfg.init_from` names, checked to fuse the same `feature_layers` as the head it starts
    (`what`, for the error)."""
    from specdraft.drafts import load_draft  # the registry imports this module: load lazily

    loaded = load_draft(cfg.init_from, target=ctx.target)
    if type(loaded.draft) is not Eagle3Draft:
        raise SpecdraftError(f"method.init_from {cfg.init_from} holds a {loaded.recipe.method_name!r} draft; "
                             f"{what} starts from an EAGLE-3 run or export")
    if list(loaded.draft.feature_layers) != list(feature_layers):
        raise SpecdraftError(f"method.init_from {cfg.init_from} fuses layers {loaded.draft.feature_layers}, this "
                             f"{what} fuses {feature_layers}; set method.feature_layers to match")
    return loaded.draft


def load_initial_state(draft: nn.Module, state: Dict[str, torch.Tensor], cfg: Eagle3Config, what: str) -> None:
    """`state` into `draft`, every weight; a mismatch is one line naming `cfg.init_from`."""
    try:
        with torch.no_grad():
            draft.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise SpecdraftError(f"method.init_from {cfg.init_from} does not fit this {what} (draft_vocab_size or "
                             f"intermediate_size differ): {str(err).splitlines()[-1].strip()}") from None


def eagle3_initialize(draft: Eagle3Draft, cfg: Eagle3Config, ctx: DraftContext) -> None:
    """`method.init_from`: every weight from an EAGLE-3 run directory or `hf` export."""
    if cfg.init_from is not None:
        source = eagle3_source(cfg, ctx, draft.feature_layers, "EAGLE-3 head")
        load_initial_state(draft, source.state_dict(), cfg, "EAGLE-3 head")


class Eagle3Drafter:
    """The runtime's EAGLE-3 drafter (specdraft/runtime/drafter.py): one draft KV cache of step-0 keys.

    Column t of the confirmed prefix holds the keys of (fused target features at t, token t+1) at rotary
    position t, as TTT step 0 wrote them in training; a tree node at depth d (sequence position n + d) is
    TTT step d at column n - 1, so its rotary position is n - 1 + d and it sees the prefix plus its ancestors.
    """

    def __init__(self, draft: Eagle3Draft, target_model):
        self.draft, self.embed_weight = draft, target_model.embed_tokens.weight  # [V, H]
        self.feature_layers, self.d2t = list(draft.feature_layers), draft.d2t
        attn = draft.midlayer.self_attn
        self.kv_heads, self.head_dim, self.theta = attn.kv_heads, attn.head_dim, attn.rope_theta

    def allocate(self, max_len: int, scratch: int, device, dtype) -> None:
        self.k_cache = torch.zeros(self.kv_heads, max_len, self.head_dim, device=device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope = rope_tables(max_len, self.head_dim, self.theta, device, self.draft.fc.weight.dtype)
        self.prefix_len = torch.zeros(1, dtype=torch.long, device=device)
        self.last_hidden = torch.zeros(1, self.draft.fc.out_features, device=device, dtype=dtype)
        self.weights = RuntimeWeights.of(self.draft.midlayer)

    def state_tensors(self):
        return [self.k_cache, self.v_cache, self.prefix_len, self.last_hidden]

    def _query(self, hidden, tokens, rope_positions, slots, position_offset=0, slot_base=None):
        """hidden [M, H]; tokens, rope_positions, slots [M] -> q [Hq, M, D] (at rope_positions + position_offset);
        writes their keys and values at slots (+ slot_base [1])."""
        return layer_query(self.draft.midlayer, self.weights, hidden, tokens, self.embed_weight, self.rope,
                           rope_positions, self.k_cache, self.v_cache, slots, position_offset, slot_base)

    def _tail(self, hidden, attended):
        """hidden [M, H], attended [Hq, M, D] (the attention's output) -> (the head's final norm of the midlayer's
        output, that output), each [M, H]."""
        attn_out = F.linear(attended.transpose(0, 1).reshape(hidden.shape[0], -1), self.weights.o)  # [M, H]
        return layer_tail(self.draft.midlayer, self.weights, self.draft.norm, hidden, attn_out)

    @torch.no_grad()  # inference only: the last row goes through out=, which autograd refuses
    def ingest(self, features, next_tokens, start, count) -> None:
        aux = torch.cat([features[i] for i in self.feature_layers], dim=-1)  # [M, 3H]
        hidden = self.draft.fc(aux.to(self.draft.fc.weight.dtype))  # [M, H]
        columns = ingest_slots(start, next_tokens.shape[0], next_tokens.device)  # [M]
        q = self._query(hidden, next_tokens, columns, columns)
        _, hidden = self._tail(hidden, ingest_attention(q, self.k_cache, self.v_cache, start))
        torch.index_select(hidden, 0, count - 1, out=self.last_hidden)  # [1, H]
        torch.add(start, count, out=self.prefix_len)

    def first(self, root_token, position):
        return self.draft.lm_head(fused_norm(self.draft.norm, self.last_hidden)), self.last_hidden

    def step(self, depth, hidden, tokens, positions, scratch_slots, scratch_visible):
        q = self._query(hidden, tokens, positions, scratch_slots, position_offset=-1, slot_base=self.prefix_len)
        attended = draft_attention(q, self.k_cache, self.v_cache, self.prefix_len, scratch_visible, root_written=False)
        normed, out = self._tail(hidden, attended)
        return self.draft.lm_head(normed), out


def eagle3_runtime(draft: Eagle3Draft, cfg: Eagle3Config, target_model) -> Eagle3Drafter:
    return Eagle3Drafter(draft, target_model)


SPEC = MethodSpec(
    name="eagle3",
    config=Eagle3Config,
    build=Eagle3Draft,
    loss=eagle3_loss,
    feature_layers=eagle3_feature_layers,
    propose=eagle3_propose,
    exports={"hf": ExportFormat(write=eagle3_to_hf, required_keys=eagle3_hf_keys),
             "speculators": ExportFormat(write=eagle3_to_speculators, required_keys=eagle3_speculators_keys)},
    from_export=eagle3_from_export,
    runtime=eagle3_runtime,
    initialize=eagle3_initialize,
)
