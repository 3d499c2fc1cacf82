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
