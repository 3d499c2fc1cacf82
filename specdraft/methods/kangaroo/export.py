"""Kangaroo's `hf` layout: the adapter and the draft vocabulary alone (the LM head and final norm stay the
target's)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List

from specdraft.core.types import TargetInfo
from specdraft.methods.kangaroo.config import KangarooConfig
from specdraft.methods.kangaroo.model import KangarooDraft


def kangaroo_to_hf(draft: KangarooDraft, cfg: KangarooConfig, target: TargetInfo, provenance: Dict[str, Any]):
    """The adapter and draft vocabulary only: the LM head and final norm stay the target's (module docstring)."""
    attn = draft.self_attn
    config = {
        "architectures": ["KangarooAdapter"],
        "model_type": target.model_type,
        "hidden_size": target.hidden_size,
        "num_attention_heads": attn.heads,
        "num_key_value_heads": attn.kv_heads,
        "head_dim": attn.head_dim,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "rope_scaling": target.rope_scaling,
        "max_position_embeddings": target.max_position_embeddings,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": draft.d2t.shape[0],
        "kangaroo_config": {
            "exit_layer": draft.exit_layer,
            "reads": "hidden state exit_layer: the input of target decoder layer exit_layer",
            "lm_head": "the target's, not in this file", "final_norm": "the target's, not in this file",
            "exit_threshold": cfg.exit_threshold,
        },
        "torch_dtype": "bfloat16",
        "specdraft": {"method": "kangaroo", "method_config": asdict(cfg), **provenance},
    }
    return config, {name: tensor.detach() for name, tensor in draft.state_dict().items()}


def kangaroo_hf_keys(draft: KangarooDraft, target: TargetInfo) -> List[str]:
    return ["input_layernorm.weight", "d2t", "t2d", *[f"self_attn.{p}_proj.weight" for p in "qkvo"]]
