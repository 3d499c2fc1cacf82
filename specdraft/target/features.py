"""Run the frozen target and keep the hidden states a draft reads (online features).

The states are taken with forward pre-hooks on the decoder layers that a draft reads, not with
`output_hidden_states` (which keeps all L + 1 states: 2.2 GB for Llama-3.1-8B at 8192 tokens)."""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import torch

from specdraft.methods.base import TargetFeatures


def _keep_input(store: Dict[int, torch.Tensor], index: int):
    def hook(module, args, kwargs):
        store[index] = args[0] if args else kwargs["hidden_states"]
    return hook


def _run_decoder(decoder, input_ids, attention_mask, position_ids, keep: List[int]):
    """-> ({i: [B, T, H]} for i in keep, final normed hidden state [B, T, H])."""
    if position_ids is not None:  # no attention mask: Hugging Face masks per document from the position ids
        inputs = {"input_ids": input_ids, "position_ids": position_ids}
    else:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if not hasattr(decoder, "layers"):  # an unusual layout: Hugging Face's own collection
        out = decoder(**inputs, output_hidden_states=True, use_cache=False)
        return {i: out.hidden_states[i] for i in keep}, out.last_hidden_state
    store: Dict[int, torch.Tensor] = {}
    num_layers = len(decoder.layers)
    hooks = [decoder.layers[i].register_forward_pre_hook(_keep_input(store, i), with_kwargs=True)
             for i in keep if i < num_layers]
    try:
        out = decoder(**inputs, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    if num_layers in keep:  # as in Hugging Face's hidden_states: the last one is after the final norm
        store[num_layers] = out.last_hidden_state
    return store, out.last_hidden_state


@torch.no_grad()
def capture_features(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: Iterable[int],
                     position_ids: Optional[torch.Tensor] = None) -> TargetFeatures:
    """input_ids, attention_mask [B, T] -> hidden states {i: [B, T, H]} for i in layers (0 always), the final
    normed hidden state and the LM head weight. The decoder runs without its LM head: no [B, T, V] logits.

    position_ids [B, T] (packed rows, positions restarting at each document) replaces the attention mask: the
    target then attends within each document only."""
    keep = sorted(set(layers) | {0})
    hidden_states, final_hidden = _run_decoder(model.get_decoder(), input_ids, attention_mask, position_ids, keep)
    return TargetFeatures(hidden_states=hidden_states, final_hidden=final_hidden,
                          lm_head=model.get_output_embeddings().weight)
