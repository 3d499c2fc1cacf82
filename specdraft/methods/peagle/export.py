"""P-EAGLE's on-disk layouts: EAGLE-3's two (SGLang's `hf`, vLLM's `speculators`) with the mask input.

`hf`: EAGLE-3's LlamaForCausalLMEagle3 config and weights plus `mask_hidden` [1, 1, A*H] and the mask token as
`pard_token`, the key vLLM's parallel-drafting proposer reads from such a config.json (serve it with
`"method": "eagle3", "parallel_drafting": true`). SGLang's EAGLE-3 loader skips `mask_hidden` (it loads only the
weights it holds), so SGLang drafts with the head autoregressively, which depths 2..K were not trained for;
specdraft's runtime and vLLM draft it in parallel.
`speculators`: speculators' PEagleSpeculatorConfig (speculators_model_type `peagle`: its `mask_token_id`, which vLLM
maps to pard_token, and EAGLE-3's fields) and weights, `mask_hidden` among them.
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from specdraft.core.types import TargetInfo
from specdraft.methods.eagle3 import (
    eagle3_export_tensors,
    eagle3_hf_config,
    eagle3_hf_keys,
    eagle3_speculators_keys,
    eagle3_to_speculators,
)
from specdraft.methods.peagle.config import PEagleConfig
from specdraft.methods.peagle.model import PEagleDraft

MASK_TENSOR = "mask_hidden"
"""The mask input's name in both layouts (speculators', SpecForge's and vLLM's)."""
OWN_MASK_TENSOR = "mask_input.mask_hidden"


def _exported(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {(MASK_TENSOR if name == OWN_MASK_TENSOR else name): tensor for name, tensor in tensors.items()}


def peagle_to_hf(draft: PEagleDraft, cfg: PEagleConfig, target: TargetInfo, provenance: Dict[str, Any]):
    config = eagle3_hf_config(draft, cfg, target, provenance)
    config["specdraft"]["method"] = "peagle"
    config["pard_token"] = draft.mask_token_id  # vLLM's parallel drafting: the mask rows' token
    config["num_speculative_tokens"] = draft.num_depths  # what the head was trained to draft at most
    tensors = {name: tensor.detach() for name, tensor in draft.state_dict().items()}
    return config, _exported(tensors)


def peagle_to_speculators(draft: PEagleDraft, cfg: PEagleConfig, target: TargetInfo, provenance: Dict[str, Any]):
    config, tensors = eagle3_to_speculators(draft, cfg, target, provenance)
    config.update(architectures=["PEagleSpeculator"], speculators_model_type="peagle",
                  mask_token_id=draft.mask_token_id)
    config["speculators_config"]["algorithm"] = "peagle"
    for proposal in config["speculators_config"]["proposal_methods"]:
        proposal["speculative_tokens"] = draft.num_depths
    config["specdraft"]["method"] = "peagle"
    return config, _exported(tensors)


def peagle_hf_keys(draft: PEagleDraft, target: TargetInfo) -> List[str]:
    return [*eagle3_hf_keys(draft, target), MASK_TENSOR]


def peagle_speculators_keys(draft: PEagleDraft, target: TargetInfo) -> List[str]:
    return [*eagle3_speculators_keys(draft, target), MASK_TENSOR]


def peagle_export_tensors(tensors: Dict[str, torch.Tensor], draft: PEagleDraft) -> Dict[str, torch.Tensor]:
    """An export's tensors as the head's state dict (MethodSpec.export_tensors): mask_hidden and speculators'
    layers.0.* under the head's names."""
    own = {(OWN_MASK_TENSOR if name == MASK_TENSOR else name): tensor for name, tensor in tensors.items()}
    return eagle3_export_tensors(own, draft)
