"""What a target family's decoder computes, as data: `Architecture` (the model) and `LayerKind` (each layer). The
verifier's layers and model read these fields and nothing else about a family; each family (families/) turns a
Hugging Face config into one. `Architecture.llama` is the plain layout every field defaults to: pre-norm
attention and a SwiGLU MLP, Llama's RMSNorm, one rotary table, full causal attention.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from specdraft.core.types import TargetInfo

ACTIVATIONS = ("silu", "gelu_tanh")
"""The gated MLP's activations: silu(gate) * up (SwiGLU), gelu_tanh(gate) * up (GeGLU, GeLU's tanh form)."""


@dataclass(frozen=True)
class Norm:
    """How the family's RMSNorms compute, beyond x * rsqrt(mean(x^2) + eps)."""

    offset: float = 0.0
    """The stored weight w scales by w + offset (Gemma: 1 + w); the weight map folds it in once."""
    weight_in_fp32: bool = False
    """The product with the weight in float32 before the cast to the dtype (Gemma), not after it (Llama); the
    weights are kept in float32 then."""


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP: a linear router over `num_experts` SiLU-gated experts, each row through its top_k."""

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    """The top k routing weights renormalised to sum 1 (Mixtral; Qwen3-MoE's norm_topk_prob), else the softmax's
    own over every expert. Either way the softmax is over every expert's logit first, then the top k."""
    shared_intermediate_size: int = 0
    """A shared expert beside the routed ones, a SwiGLU MLP of this width gated by sigmoid(x . g) (Qwen2-MoE); 0:
    none."""


@dataclass(frozen=True)
class LayerKind:
    """One decoder layer's own choices."""

    intermediate_size: int
    """The dense MLP's width (unused by an experts layer)."""
    sliding_window: Optional[int] = None
    """A sliding-window (local) layer: each query sees the w latest positions, its own included; None: full."""
    rope: int = 0
    """Which of `Architecture.rope_kinds` its rotary tables are."""
    experts: Optional[Experts] = None
    """A mixture-of-experts layer: these in place of the dense MLP."""


@dataclass(frozen=True)
class Architecture:
    layers: Tuple[LayerKind, ...]
    qkv_bias: bool = False
    """Biases on q, k and v (Qwen2)."""
    qk_norm: bool = False
    """An RMSNorm over each head's q and k before the rotation (Qwen3, Gemma 3), weights [D] each."""
    norm: Norm = field(default_factory=Norm)
    sandwich_norms: bool = False
    """A norm on the attention's output and one on the MLP's output, each before its residual add, beside the
    pre-norms (Gemma: post_attention_layernorm, post_feedforward_layernorm)."""
    activation: str = "silu"
    embed_scale: Optional[float] = None
    """The embeddings multiplied by this (rounded to the dtype, as Gemma's own scale is), e.g. sqrt(H); None: 1."""
    attention_scale: Optional[float] = None
    """The attention's query scaling (Gemma: query_pre_attn_scalar ** -0.5); None: head_dim ** -0.5."""
    final_logit_softcap: Optional[float] = None
    """logits = cap * tanh(logits / cap) (Gemma 2 and 3 configs that set final_logit_softcapping); None: none."""
    rope_kinds: Tuple[Optional[str], ...] = (None,)
    """The rotary tables the layers use: what the Hugging Face rotary module is asked for each (its layer type,
    Gemma 3's local and global bases; None: its one table)."""

    @classmethod
    def llama(cls, info: TargetInfo, qkv_bias: bool = False) -> "Architecture":
        """The plain layout of `info`'s geometry: every layer dense, full attention, one rotary table."""
        return cls(layers=(LayerKind(info.intermediate_size),) * info.num_layers, qkv_bias=qkv_bias)

    @property
    def has_experts(self) -> bool:
        return any(kind.experts is not None for kind in self.layers)

    def scale(self, head_dim: int) -> float:
        return head_dim ** -0.5 if self.attention_scale is None else self.attention_scale
