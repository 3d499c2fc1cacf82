"""Run the frozen target and keep the hidden states a draft reads (online features)."""
from __future__ import annotations

from typing import Iterable

import torch

from specdraft.methods.base import TargetFeatures


@torch.no_grad()
def capture_features(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     layers: Iterable[int]) -> TargetFeatures:
    """input_ids, attention_mask [B, T] -> hidden states {i: [B, T, H]} for i in layers (0 always), the final
    normed hidden state and the LM head weight. The decoder runs without its LM head: no [B, T, V] logits."""
    out = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                              use_cache=False)
    keep = sorted(set(layers) | {0})
    return TargetFeatures(hidden_states={i: out.hidden_states[i] for i in keep}, final_hidden=out.last_hidden_state,
                          lm_head=model.get_output_embeddings().weight)


def embeddings_from_table(model, input_ids: torch.Tensor) -> bool:
    """Whether the embedding table alone gives hidden_states[0] for input_ids [1, T] (a target that scales its
    embeddings inside its forward does not: then stored features must keep index 0)."""
    stored = capture_features(model, input_ids, torch.ones_like(input_ids), [0]).hidden_states[0]  # [1, T, H]
    with torch.no_grad():
        looked_up = model.get_input_embeddings()(input_ids)  # [1, T, H]
    return torch.equal(stored, looked_up.to(stored.dtype))


def layers_to_store(spec, method_cfg, info, model) -> list:
    """Hidden-state indices that stored (offline) features need: the method's, plus 0 when it reads the token
    embeddings and the embedding table cannot recompute them."""
    layers = set(spec.feature_layers(method_cfg, info))
    probe = torch.arange(8, device=model.get_input_embeddings().weight.device)[None]  # [1, 8]
    if spec.reads_embeddings and not embeddings_from_table(model, probe):
        layers.add(0)
    return sorted(layers)
