"""`VerifierModel`: the target as the runtime runs it, batch 1, over a static KV cache.

Rotary tables come in at `allocate` (weights.py takes them from the Hugging Face model's own rotary module, so every
rope scaling it supports is reproduced). A prompt may bring tables of its own (`use_rope`: an M-RoPE target's image
prompt, whose positions differ from its slots), copied over the default ones in place, so that captured CUDA
graphs read them. `run_layers` writes the keys and values of its N tokens at cache slots prefix_len..prefix_len+N-1;
a drafter's pass over tree nodes scattered in the cache (`run_layers_at`) writes at the slots it is given and
attends by a mask over every slot instead.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from specdraft.core.types import TargetInfo
from specdraft.kernels.rms_norm import rms_norm
from specdraft.decoding.verifier.layer import DecoderLayer, linear_layer


class VerifierModel(nn.Module):
    """Batch-1 decoder with a static KV cache of `max_len` slots: [L, Hkv, S, D] keys and values. With `bits`
    (8 or 4) its linear layers and LM head are weight-only quantized (QuantizedLinear)."""

    def __init__(self, info: TargetInfo, qkv_bias: bool = False, bits: Optional[int] = None):
        super().__init__()
        self.info, self.bits = info, bits
        self.embed_tokens = nn.Embedding(info.vocab_size, info.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(info, qkv_bias, bits) for _ in range(info.num_layers))
        self.norm = nn.Parameter(torch.ones(info.hidden_size))
        self.lm_head = linear_layer(info.hidden_size, info.vocab_size, False, bits)
        self.max_len = 0

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
        """Static caches for `max_len` slots; rope tables [max_len, D]."""
        info, weight = self.info, self.embed_tokens.weight
        shape = (info.num_layers, info.num_kv_heads, max_len, info.head_dim)
        self.k_cache = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.rope_cos, self.rope_sin = rope_cos.to(weight), rope_sin.to(weight)
        self.default_rope = (self.rope_cos.clone(), self.rope_sin.clone())
        self.own_rope = False  # the tables hold a prompt's own (use_rope), not the defaults
        self.max_len = max_len

    def use_rope(self, tables: Optional[Tuple[torch.Tensor, torch.Tensor]]) -> None:
        """A prompt's rotary tables cos, sin [max_len, D] (indexed by position = cache slot), or None: the
        defaults. Copied into the tables in place (outside CUDA graphs: once per prompt)."""
        if tables is None and not self.own_rope:
            return
        cos, sin = tables if tables is not None else self.default_rope
        self.rope_cos.copy_(cos[:self.max_len])
        self.rope_sin.copy_(sin[:self.max_len])
        self.own_rope = tables is not None

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [N] -> [N, H]
        return self.embed_tokens(tokens)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        return rms_norm(hidden, self.norm, self.info.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, H] (pre-norm) -> [N, V]
        return self.lm_head(self.final_norm(hidden))

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
            layer_input, hidden, pending = self.layers[index](
                hidden, pending, (self.rope_cos, self.rope_sin), positions, self.k_cache[index], self.v_cache[index],
                slots, **attention)
            if index in capture:
                captured[index] = layer_input
        if pending is not None:
            hidden = hidden + pending
        if end_layer in capture:
            captured[end_layer] = hidden
        return hidden, captured
