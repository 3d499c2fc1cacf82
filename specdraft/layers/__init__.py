"""Shared building blocks for draft heads: RMSNorm, rotary embeddings, SwiGLU MLP, GQA helpers."""
from specdraft.layers.blocks import RMSNorm, SwiGLU, apply_rope, repeat_kv, rope_cos_sin

__all__ = ["RMSNorm", "SwiGLU", "apply_rope", "repeat_kv", "rope_cos_sin"]
