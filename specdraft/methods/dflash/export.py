"""DFlash's on-disk layouts: SGLang's and z-lab's `DFlashDraftModel` (`hf`: a Qwen3-style config with a
`dflash_config`, the draft's layers, fc, hidden_norm and norm, the target's own embedding and LM head) and the
`speculators` layout vLLM loads (`speculators_model_type: dflash`); and reading a checkpoint of either that
specdraft did not write (`dflash_export_config`).

Feature layers: `feature_layers` index the target's hidden-state stack by the layer they enter (index 0 = token
embeddings). speculators' `aux_hidden_state_layer_ids` count the same way (vLLM maps them to its DFlash model's
`target_layer_ids` by subtracting 1); SGLang's and z-lab's `dflash_config.target_layer_ids` name the layer whose
output it is: feature_layers - 1. The draft's rotary embedding is the plain one at the target's θ (as in training),
so the configs carry no rope scaling.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List

import torch

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import TargetInfo
from specdraft.methods.dflash.config import DFlashConfig
from specdraft.methods.dflash.model import DFlashDraft
from specdraft.methods.eagle3.export import verifier_name

SPECULATORS_VERSION = "0.9.0"
"""The speculators release whose DFlash config class (DFlashSpeculatorConfig) the layout follows."""


def _layer_config(draft: DFlashDraft, target: TargetInfo) -> Dict[str, Any]:
    """The draft layers' Qwen3-style geometry (the keys every layout shares)."""
    attn = draft.layers[0].self_attn
    return {
        "model_type": "qwen3",
        "hidden_size": target.hidden_size,
        "intermediate_size": draft.layers[0].mlp.gate_proj.out_features,
        "num_hidden_layers": len(draft.layers),
        "num_attention_heads": attn.heads,
        "num_key_value_heads": attn.kv_heads,
        "head_dim": attn.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "vocab_size": target.vocab_size,
        "max_position_embeddings": target.max_position_embeddings,
        "rope_theta": target.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": target.rope_theta},
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": target.bos_token_id,
        "eos_token_id": target.eos_token_id,
    }


def _tensors(draft: DFlashDraft) -> Dict[str, torch.Tensor]:
    return {name: tensor.detach() for name, tensor in draft.state_dict().items()}


def dflash_to_hf(draft: DFlashDraft, cfg: DFlashConfig, target: TargetInfo, provenance: Dict[str, Any]):
    """SGLang's (and z-lab's) DFlashDraftModel: layers.*, fc, hidden_norm, norm; the target's embedding and head."""
    if not draft.shares_target_head:
        raise SpecdraftError(f"the hf (SGLang) DFlash layout drafts with the target's own LM head; this draft has a "
                             f"head of its own (method.draft_vocab_size {cfg.draft_vocab_size}): export it with "
                             f"--format speculators")
    block = {"block_size": cfg.block_size, "mask_token_id": draft.mask_token_id,
             "target_layer_ids": [i - 1 for i in draft.feature_layers], "num_target_layers": target.num_layers}
    config = {"architectures": ["DFlashDraftModel"], **_layer_config(draft, target), "block_size": cfg.block_size,
              "num_target_layers": target.num_layers, "dflash_config": block, "torch_dtype": "bfloat16",
              "specdraft": {"method": "dflash", "method_config": asdict(cfg), **provenance}}
    return config, _tensors(draft)


def dflash_to_speculators(draft: DFlashDraft, cfg: DFlashConfig, target: TargetInfo, provenance: Dict[str, Any]):
    """The speculators layout (DFlashSpeculatorConfig) vLLM loads; a trained head's lm_head, d2t, t2d with it."""
    vocab = target.vocab_size if draft.shares_target_head else draft.lm_head.out_features
    config = {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _layer_config(draft, target),
        "draft_vocab_size": vocab,
        "block_size": cfg.block_size,
        "target_hidden_size": target.hidden_size,
        "aux_hidden_state_layer_ids": list(draft.feature_layers),
        "mask_token_id": draft.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name(provenance, target),
                         "architectures": list(target.architectures)},
        },
        "torch_dtype": "bfloat16",
        "specdraft": {"method": "dflash", "method_config": asdict(cfg), **provenance},
    }
    return config, _tensors(draft)


def dflash_keys(draft: DFlashDraft, target: TargetInfo) -> List[str]:
    """Every weight an export must hold (both layouts name them alike)."""
    keys = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    for i in range(len(draft.layers)):
        keys += [f"layers.{i}.{name}.weight" for name in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj")]
    return keys + ([] if draft.shares_target_head else ["lm_head.weight", "d2t", "t2d"])


def dflash_export_config(config: Dict[str, Any]) -> DFlashConfig:
    """The draft's config from a DFlash checkpoint's own keys (one no specdraft export wrote): SGLang's and z-lab's
    (`dflash_config`) or speculators' (`transformer_layer_config`)."""
    if "transformer_layer_config" in config:  # speculators
        layers = config["transformer_layer_config"]
        vocab = config.get("draft_vocab_size")
        return DFlashConfig(block_size=config.get("block_size", 8), num_layers=layers["num_hidden_layers"],
                            mask_token_id=config.get("mask_token_id"),
                            feature_layers=config.get("aux_hidden_state_layer_ids"),
                            draft_vocab_size=None if vocab in (None, layers.get("vocab_size")) else vocab,
                            intermediate_size=layers.get("intermediate_size"))
    block = config.get("dflash_config") or {}
    layer_ids = block.get("target_layer_ids", config.get("target_layer_ids"))
    return DFlashConfig(block_size=block.get("block_size", config.get("block_size", 16)),
                        num_layers=config["num_hidden_layers"], mask_token_id=block.get("mask_token_id"),
                        feature_layers=[i + 1 for i in layer_ids] if layer_ids else None,
                        intermediate_size=config.get("intermediate_size"))


def dflash_export_tensors(tensors: Dict[str, torch.Tensor], draft: DFlashDraft) -> Dict[str, torch.Tensor]:
    """An export's tensors as the draft's state dict: what the draft does not hold (a checkpoint's embed_tokens,
    speculators' verifier weights) left out."""
    own = draft.state_dict()
    return {name: tensor for name, tensor in tensors.items() if name in own}
