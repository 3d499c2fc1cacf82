"""How a target family forms its logits from the final normed hidden state, where that differs from Llama's
`final_hidden @ lm_head.T`: what training's teacher (TargetFeatures.logits_for) must add to be the target's own.

Keyed by the language model's `model_type` (a vision-language target's text config). Everything else training reads
of a target is the same for every family and read from Hugging Face's own forward: the hidden states are the inputs
of the decoder layers as `output_hidden_states` gives them (Gemma's embeddings scaled by sqrt(H) included), the
final hidden state is after the family's own final norm (Gemma's +1 offset included), the LM head is the output
embedding (tied or not, found by parameter identity in specdraft.targets.heads), and a mixture-of-experts router is
inside the layers, never captured. A family absent here forms its logits as Llama does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional


@dataclass(frozen=True)
class HeadForm:
    softcap_field: Optional[str] = None
    """The config field holding c of a tanh softcap on the final logits, c * tanh(logits / c) (its value None: no
    softcap); None: the family has none."""


PLAIN = HeadForm()
"""Logits = final_hidden @ lm_head.T (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, ...)."""

HEAD_FORMS: Dict[str, HeadForm] = {
    "gemma2": HeadForm(softcap_field="final_logit_softcapping"),
    "gemma3_text": HeadForm(softcap_field="final_logit_softcapping"),
}
"""Text model_type -> how its logits differ from PLAIN (transformers' Gemma2ForCausalLM and Gemma3ForCausalLM
cap them when the config sets final_logit_softcapping; Gemma 3's checkpoints leave it null)."""


def head_form(config) -> HeadForm:
    """The form of a target's logits from its Hugging Face config (a vision-language one's language part)."""
    return HEAD_FORMS.get(config.get_text_config().model_type, PLAIN)


def logit_softcap(config) -> Optional[float]:
    """c of the target's final-logit softcap c * tanh(logits / c) from its Hugging Face config, or None."""
    field = head_form(config).softcap_field
    value = getattr(config.get_text_config(), field, None) if field else None
    return float(value) if value else None
