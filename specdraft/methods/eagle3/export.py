"""EAGLE-3's on-disk layouts: SGLang's `LlamaForCausalLMEagle3` (`hf`) and vLLM's `speculators`, their reading
back (`eagle3_export_config`, `eagle3_export_tensors`: hooks of MethodSpec's default from_export), and the warm
start from a run or an export (`method.init_from`).

Feature layers: `feature_layers` are indices into the target's hidden-state stack, where index i is the *input*
of decoder layer i (index 0 = token embeddings). SGLang and vLLM name the same states by the layer that *outputs*
them, so the exports write `eagle_aux_hidden_state_layer_ids = [i - 1 for i in feature_layers]`.
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import DraftContext, TargetInfo
from specdraft.methods.eagle3.config import Eagle3Config
from specdraft.methods.eagle3.model import Eagle3Draft
from specdraft.targets.provenance import hf_architectures

log = logging.getLogger(__name__)


def sliding_window_config(cfg: Eagle3Config) -> Dict[str, Any]:
    """A windowed draft's layer fields as the engines read them: `sliding_window` with the layer typed
    "sliding_attention" (vLLM's Llama attention reads both, in a speculators export's transformer_layer_config;
    SGLang's Llama EAGLE-3 layer reads neither and attends to the whole context). The sinks have no engine field:
    specdraft's runtime reads them from the method config. {} for full attention."""
    window = cfg.ttt_window()
    if not window.size:
        return {}
    return {"sliding_window": window.size, "layer_types": ["sliding_attention"]}


def eagle3_hf_config(draft: Eagle3Draft, cfg: Eagle3Config, target: TargetInfo, provenance: Dict[str, Any]):
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target.hidden_size,
        "intermediate_size": draft.midlayer.mlp.gate_proj.out_features,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": draft.lm_head.out_features,
        "max_position_embeddings": target.max_position_embeddings,
        "rope_theta": target.rope_theta,
        "rope_scaling": target.rope_scaling,
        **sliding_window_config(cfg),
        "tie_word_embeddings": False,
        "bos_token_id": target.bos_token_id,
        "eos_token_id": target.eos_token_id,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in draft.feature_layers],
            "use_aux_hidden_state": True,
        },
        **eagle31_flags(draft),
        "specdraft": {"method": "eagle3", "method_config": asdict(cfg), **provenance},
    }


def eagle31_flags(draft: Eagle3Draft) -> Dict[str, bool]:
    """EAGLE-3.1's switches as vLLM's and SGLang's EAGLE-3 configs read them (top-level keys of config.json)."""
    return {"fc_norm": draft.fc_norm is not None, "norm_output": draft.norm_output}


def eagle3_to_hf(draft: Eagle3Draft, cfg: Eagle3Config, target: TargetInfo, provenance: Dict[str, Any]):
    """SGLang's LlamaForCausalLMEagle3 layout: midlayer.*, fc, norm, lm_head, d2t, t2d; no embed_tokens."""
    tensors = {name: tensor.detach() for name, tensor in draft.state_dict().items()}
    return eagle3_hf_config(draft, cfg, target, provenance), tensors


def eagle3_hf_keys(draft: Eagle3Draft, target: TargetInfo) -> List[str]:
    return ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
            "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
            *[f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"],
            *[f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")],
            *([f"fc_norm.{i}.weight" for i in range(len(draft.fc_norm))] if draft.fc_norm is not None else [])]


def verifier_name(provenance: Dict[str, Any], target: TargetInfo) -> str:
    """What vLLM loads as the verifier: the target's hub id where the export knows it (`target_hub_id`), else
    the target's path, with a warning that vLLM cannot resolve it and how to name the hub id instead."""
    hub_id = provenance.get("target_hub_id")
    if hub_id:
        return hub_id
    path = provenance.get("target", target.name_or_path)
    log.warning("speculators export: the target %s names no hub id (a local file or directory, or a GGUF whose "
                "metadata records none), so verifier.name_or_path keeps that path, which vLLM cannot load; export "
                "again with --verifier HUB_ID (the target's model on the hub, e.g. "
                "HuggingFaceTB/SmolLM2-135M-Instruct for SmolLM2's GGUF)", path)
    return path


def eagle3_to_speculators(draft: Eagle3Draft, cfg: Eagle3Config, target: TargetInfo, provenance: Dict[str, Any]):
    """The `speculators` layout that vLLM reads: layers.0.* instead of midlayer.*, a speculators_config, and
    aux layer ids counted as vLLM does (index i = input of layer i, our own convention)."""
    hf_config, tensors = eagle3_to_hf(draft, cfg, target, provenance)
    layer_config = {k: hf_config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                                                "vocab_size", "max_position_embeddings", "rope_theta",
                                                "rope_scaling", "bos_token_id", "eos_token_id")}
    layer_config.update(sliding_window_config(cfg))
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        # the draft's own layer, Llama's for every target family: vLLM builds Eagle3LlamaForCausalLM for "llama"
        "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1, **layer_config},
        "draft_vocab_size": hf_config["draft_vocab_size"],
        "target_hidden_size": target.hidden_size,
        "norm_before_residual": False,
        **eagle31_flags(draft),
        "eagle_aux_hidden_state_layer_ids": list(draft.feature_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.ttt_steps,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name(provenance, target),
                         "architectures": hf_architectures(target)},
        },
        "torch_dtype": "bfloat16",
        "specdraft": hf_config["specdraft"],
    }
    return config, {k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items()}


def eagle3_speculators_keys(draft: Eagle3Draft, target: TargetInfo) -> List[str]:
    return [k.replace("midlayer.", "layers.0.", 1) for k in eagle3_hf_keys(draft, target)]


def eagle3_export_config(config: Dict[str, Any]) -> Eagle3Config:
    """The head's config from an SGLang-style EAGLE-3 checkpoint's own keys (one no specdraft export wrote)."""
    aux_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    sliding = "sliding_attention" in (config.get("layer_types") or []) and config.get("sliding_window")
    return Eagle3Config(draft_vocab_size=config["draft_vocab_size"], intermediate_size=config.get("intermediate_size"),
                        feature_layers=[i + 1 for i in aux_ids] if aux_ids else None,
                        attention_window=int(sliding or 0), attention_sinks=0,
                        fc_norm=bool(config.get("fc_norm", False)), norm_output=bool(config.get("norm_output", False)))


def eagle3_export_tensors(tensors: Dict[str, torch.Tensor], draft: Eagle3Draft) -> Dict[str, torch.Tensor]:
    """An export's tensors as the head's state dict: speculators' layers.0.* as midlayer.*, and what the head does
    not hold (a checkpoint's embed_tokens) left out."""
    tensors = {k.replace("layers.0.", "midlayer.", 1): v for k, v in tensors.items()}  # speculators names
    return {k: v for k, v in tensors.items() if k in draft.state_dict()}


def check_source(source: nn.Module, cfg: Eagle3Config, feature_layers: List[int], what: str) -> Eagle3Draft:
    """The draft `cfg.init_from` named (loaded by the trainer), checked to be an EAGLE-3 head fusing the same
    `feature_layers` as the head it starts (`what`, for the error)."""
    if type(source) is not Eagle3Draft:
        raise SpecdraftError(f"method.init_from {cfg.init_from} holds a {type(source).__name__}; {what} starts from "
                             f"an EAGLE-3 run or export")
    if list(source.feature_layers) != list(feature_layers):
        raise SpecdraftError(f"method.init_from {cfg.init_from} fuses layers {source.feature_layers}, this "
                             f"{what} fuses {feature_layers}; set method.feature_layers to match")
    return source


def load_initial_state(draft: nn.Module, state: Dict[str, torch.Tensor], cfg: Eagle3Config, what: str) -> None:
    """`state` into `draft`, every weight; a mismatch is one line naming `cfg.init_from`."""
    try:
        with torch.no_grad():
            draft.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise SpecdraftError(f"method.init_from {cfg.init_from} does not fit this {what} (draft_vocab_size or "
                             f"intermediate_size differ): {str(err).splitlines()[-1].strip()}") from None


def eagle3_warm_start(cfg: Eagle3Config) -> Optional[str]:
    """The run or export whose draft starts this one (`method.init_from`)."""
    return cfg.init_from


def eagle3_initialize(draft: Eagle3Draft, cfg: Eagle3Config, ctx: DraftContext) -> None:
    """`method.init_from` (loaded by the trainer into ctx.warm_start): every weight from an EAGLE-3 run or export."""
    source = check_source(ctx.warm_start, cfg, draft.feature_layers, "EAGLE-3 head")
    load_initial_state(draft, source.state_dict(), cfg, "EAGLE-3 head")
