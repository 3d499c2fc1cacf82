"""The target families the verifier runs, one file each (a description, `describe`, and a weight map, `load`:
base.py says what a `Family` is), registered here by Hugging Face model type. Nothing outside a family's own file
branches on it: the verifier reads its `Architecture`.

    llama.py      llama, qwen2, mistral, qwen2_vl_text, qwen2_5_vl_text
    qwen3.py      qwen3          (q/k norms)
    gemma3.py     gemma3_text    (1 + w norms in float32, sandwich norms, GeGLU, scaled embeddings, local/global)
    qwen3_moe.py  qwen3_moe      (q/k norms, routed experts)
    qwen2_moe.py  qwen2_moe      (routed experts and a gated shared expert)
    mixtral.py    mixtral        (routed experts)
"""
from typing import Dict

from specdraft.core.errors import SpecdraftError
from specdraft.decoding.verifier.families import gemma3, llama, mixtral, qwen2_moe, qwen3, qwen3_moe
from specdraft.decoding.verifier.families.base import Family, UnsupportedTarget

FAMILIES: Dict[str, Family] = {model_type: module.FAMILY
                               for module in (llama, qwen3, gemma3, qwen3_moe, qwen2_moe, mixtral)
                               for model_type in module.FAMILY.model_types}
"""Hugging Face model type -> its family."""
SUPPORTED = tuple(FAMILIES)


def unknown_family(model_type: str) -> str:
    return f"the runtime runs the target families {', '.join(SUPPORTED)}; this target is {model_type!r}"


def family_for(model_type: str) -> Family:
    """The family of a Hugging Face model type, or a one-line error naming it and the known ones."""
    if model_type not in FAMILIES:
        raise SpecdraftError(unknown_family(model_type))
    return FAMILIES[model_type]


__all__ = ["FAMILIES", "Family", "SUPPORTED", "UnsupportedTarget", "family_for", "unknown_family"]
