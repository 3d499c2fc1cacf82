"""`VerifierModel`: the target as the runtime runs it, batch 1, over a static KV cache, its layout as its family's
`Architecture` says (architecture.py; the plain Llama layout by default).

Rotary tables come in at `allocate` (weights.py takes them from the Hugging Face model's own rotary module, so every
rope scaling it supports is reproduced; one table per `rope_kinds` entry, each layer reading its own). A prompt may
bring tables of its own (`use_rope`: an M-RoPE target's image prompt, whose positions differ from its slots),
copied over the default ones in place, so that captured CUDA graphs read them. A sliding-window layer honours its
window wherever it attends; a window of at least the cache's length never cuts anything, so it is dropped there.
`run_layers` writes the keys and values of its N tokens at cache slots prefix_len..prefix_len+N-1;
a drafter's pass over tree nodes scattered in the cache (`run_layers_at`) writes at the slots it is given and
attends by a mask over every slot instead.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from specdraft.core.types import TargetInfo
from specdraft.kernels.rms_norm import rms_norm
from specdraft.decoding.verifier.architecture import Architecture
from specdraft.decoding.verifier.layer import DecoderLayer, linear_layer


class VerifierModel(nn.Module):
    """Batch-1 decoder with a static KV cache of `max_len` slots: [L, Hkv, S, D] keys and values. With `bits`
    (8 or 4) its linear layers and LM head are weight-only quantized (QuantizedLinear). `architecture`: the
    family's layout (None: the plain Llama layout, `qkv_bias` its q/k/v biases)."""

    def __init__(self, info: TargetInfo, qkv_bias: bool = False, bits: Optional[int] = None,
                 architecture: Optional[Architecture] = None):
        super().__init__()
        architecture = architecture or Architecture.llama(info, qkv_bias)
        self.info, self.bits, self.architecture = info, bits, architecture
        self.embed_tokens = nn.Embedding(info.vocab_size, info.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(info, architecture, kind, bits) for kind in architecture.layers)
        self.norm = nn.Parameter(torch.ones(info.hidden_size))
        self.lm_head = linear_layer(info.hidden_size, info.vocab_size, False, bits)
        if architecture.embed_scale is not None:  # a buffer: cast with the model, rounded to its dtype as HF's is
            self.register_buffer("embed_scale", torch.tensor(architecture.embed_scale), persistent=False)
        self.max_len = 0
        self.sliding_windows: Tuple[Optional[int], ...] = tuple(kind.sliding_window for kind in architecture.layers)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype it computes in."""
        return self.embed_tokens.weight.dtype

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H] (a quantized head's dequantized: a new tensor each call)
        return self.lm_head.weight

    def allocate(self, max_len: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> None:
        """Static caches for `max_len` slots; rope tables [max_len, D], or [R, max_len, D] for a family of R kinds
        (`Architecture.rope_kinds`)."""
        info, weight = self.info, self.embed_tokens.weight
        shape = (info.num_layers, info.num_kv_heads, max_len, info.head_dim)
        self.k_cache = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        tables = [(cos.to(weight), sin.to(weight)) for cos, sin in zip(*rope_kinds(rope_cos, rope_sin))]
        self.rope_tables = tables  # [(cos, sin) [max_len, D]] per rope kind
        self.rope_cos, self.rope_sin = tables[0]  # the first kind's: what `use_rope` replaces
        self.default_rope = (self.rope_cos.clone(), self.rope_sin.clone())
        self.own_rope = False  # the tables hold a prompt's own (use_rope), not the defaults
        self.max_len = max_len
        self.sliding_windows = effective_windows(self.architecture, max_len)

    def use_rope(self, tables: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        """A prompt's rotary tables cos, sin [max_len, D] (indexed by position = cache slot), or None: the
        defaults. Copied into the tables in place (outside CUDA graphs: once per prompt)."""
        if tables is None and not self.own_rope:
            return
        cos, sin = tables if tables is not None else self.default_rope
        self.rope_cos.copy_(cos[:self.max_len])
        self.rope_sin.copy_(sin[:self.max_len])
        self.own_rope = tables is not None

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [N] -> [N, H], the input of layer 0
        embeds = self.embed_tokens(tokens)
        return embeds if self.architecture.embed_scale is None else embeds * self.embed_scale

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        return rms_norm(hidden, self.norm, self.info.rms_norm_eps, weight_in_fp32=self.architecture.norm.weight_in_fp32)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] (pre-norm) -> [N, V]
        logits = self.lm_head(self.final_norm(hidden))
        cap = self.architecture.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def run_layers(self, hidden: torch.Tensor, positions: torch.Tensor, prefix_len: torch.Tensor,
                   tree_mask: Optional[torch.Tensor], start_layer: int = 0, end_layer: Optional[int] = None,
                   capture: Iterable[int] = ()) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
        """hidden [N, H] entering layer `start_layer`; positions [N]; prefix_len [1] int64; tree_mask [N, N] bool
        (None: a causal prefill from an empty cache) -> (hidden [N, H] after `end_layer`-1, {i: input of layer i})."""
        slots = prefix_len + torch.arange(hidden.shape[0], device=hidden.device)  # [N]
        attention = {"prefix_len": prefix_len, "tree_mask": tree_mask, "causal_prefill": tree_mask is None}
        return self._layers(hidden, positions, slots, attention, start_layer, end_layer, capture)

    def run_layers_at(self, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      slot_mask: torch.Tensor, end_layer: int,
                      capture: Iterable[int] = ()) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
        """Embeddings hidden [N, H] at positions [N] through layers 0..end_layer-1, their KV written at any cache
        slots [N], row i attending to the slots slot_mask [N, S] marks -> as `run_layers`. For a drafter's pass
        over tree nodes whose ancestors sit anywhere in the cache: `tree_attention` sees one window of nodes."""
        attention = {"prefix_len": None, "tree_mask": None, "causal_prefill": False, "slot_mask": slot_mask}
        return self._layers(hidden, positions, slots, attention, 0, end_layer, capture)

    def _layers(self, hidden, positions, slots, attention: dict, start_layer: int, end_layer: Optional[int],
                capture: Iterable[int]) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
        """The layer loop of `run_layers` and `run_layers_at`; `attention` holds the layers' attention arguments."""
        end_layer = self.info.num_layers if end_layer is None else end_layer
        capture = set(capture)
        captured, pending = {}, None
        for index in range(start_layer, end_layer):  # each layer adds the previous one's MLP output
            layer = self.layers[index]
            layer_input, hidden, pending = layer(
                hidden, pending, self.rope_tables[layer.kind.rope], positions, self.k_cache[index],
                self.v_cache[index], slots, sliding_window=self.sliding_windows[index], **attention)
            if index in capture:
                captured[index] = layer_input
        if pending is not None:
            hidden = hidden + pending
        if end_layer in capture:
            captured[end_layer] = hidden
        return hidden, captured


def rope_kinds(cos: torch.Tensor, sin: torch.Tensor) -> Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]:
    """Rotary tables [S, D] (one kind) or [R, S, D] -> (the cos tables, the sin tables), one [S, D] per kind."""
    if cos.dim() == 2:
        return (cos,), (sin,)
    return tuple(cos.unbind(0)), tuple(sin.unbind(0))


def effective_windows(architecture: Architecture, length: int) -> Tuple[Optional[int], ...]:
    """Each layer's sliding window over sequences of up to `length` tokens: None where it has none, or where it
    is at least `length` (it never cuts there)."""
    return tuple(kind.sliding_window if kind.sliding_window is not None and kind.sliding_window < length else None
                 for kind in architecture.layers)
