"""The verifier: the target as the runtime runs it, a compact static-cache decoder (batch 1, in the spirit of
gpt-fast) that verifies every drafted tree and chain. Not `specdraft.targets`, which loads Hugging Face models:
this package builds the runtime's own model from one.

- `layer.py`: `DecoderLayer`, one pre-norm decoder layer with fused q/k/v and gate/up matmuls and the runtime's
  kernels (rms_norm, rope_cache, tree_attention, silu_mul); `linear_layer` (float or weight-only quantized).
- `model.py`: `VerifierModel`, the embedding, the layers, the final norm and the LM head over a static KV cache
  ([L, Hkv, S, D] keys and values), with the forwards the engine runs (`run_layers`, `run_layers_at`).
- `weights.py`: the Hugging Face weight map (`from_hf`: which HF tensors fill which fused weight, for the
  Llama-family models in `SUPPORTED`), `quantized_verifier` (a float verifier to int8/int4) and `hf_rope_tables`
  (the rotary tables of the HF model's own rotary module).

A model family of another layout is a layer and a weight map of its own beside these; the engine reads only
`VerifierModel`'s forwards.
"""
from specdraft.decoding.verifier.layer import DecoderLayer, linear_layer
from specdraft.decoding.verifier.model import VerifierModel
from specdraft.decoding.verifier.weights import SUPPORTED, from_hf, hf_rope_tables, quantized_verifier

__all__ = ["DecoderLayer", "SUPPORTED", "VerifierModel", "from_hf", "hf_rope_tables", "linear_layer",
           "quantized_verifier"]
