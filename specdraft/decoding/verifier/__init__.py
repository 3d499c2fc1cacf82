"""The verifier: the target as the runtime runs it, a compact static-cache decoder (batch 1, in the spirit of
gpt-fast) that verifies every drafted tree and chain. Not `specdraft.targets`, which loads Hugging Face models:
this package builds the runtime's own model from one.

- `architecture.py`: what a family's decoder computes, as data (`Architecture`, `LayerKind`: q/k norms, norm
  offsets, sandwich norms, the activation, embedding and query scales, sliding windows and rotary kinds, routed
  experts).
- `layer.py`: `DecoderLayer`, one pre-norm decoder layer as the architecture says, with fused q/k/v and gate/up
  matmuls and the runtime's kernels (rms_norm, rope_cache, tree_attention, silu_mul, grouped_experts);
  `linear_layer` (float or weight-only quantized).
- `model.py`: `VerifierModel`, the embedding, the layers, the final norm and the LM head over a static KV cache
  ([L, Hkv, S, D] keys and values), with the forwards the engine runs (`run_layers`, `run_layers_at`).
- `families/`: one file per target family (its description and its Hugging Face weight map), registered by model
  type (`SUPPORTED`).
- `weights.py`: `from_hf` (the family's verifier of a Hugging Face model), `unsupported_reason`,
  `quantized_verifier` (a float verifier to int8/int4) and `hf_rope_tables` (the rotary tables of the HF model's
  own rotary module).

The engine reads only `VerifierModel`'s forwards.
"""
from specdraft.decoding.verifier.architecture import Architecture, Experts, LayerKind, Norm
from specdraft.decoding.verifier.layer import DecoderLayer, linear_layer
from specdraft.decoding.verifier.model import VerifierModel
from specdraft.decoding.verifier.weights import (SUPPORTED, architecture_of, from_hf, hf_rope_tables,
                                                 quantized_verifier, unsupported_reason)

__all__ = ["Architecture", "DecoderLayer", "Experts", "LayerKind", "Norm", "SUPPORTED", "VerifierModel",
           "architecture_of", "from_hf", "hf_rope_tables", "linear_layer", "quantized_verifier",
           "unsupported_reason"]
