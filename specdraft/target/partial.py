"""Run only the first layers of a Hugging Face decoder, with their own KV cache: what a self-speculative draft
(Kangaroo) runs on each drafted token in the plain evaluator. The fast runtime has its own target
(specdraft/runtime/target.py, `run_layers`)."""
from __future__ import annotations

import torch


def new_layer_cache(model):
    """An empty Hugging Face cache for `model`'s decoder (only the layers that run fill it)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@torch.no_grad()
def run_first_layers(model, hidden: torch.Tensor, positions: torch.Tensor, cache, num_layers: int) -> torch.Tensor:
    """hidden [1, N, H] (token embeddings) at positions [N], appended after what `cache` holds -> the input of
    decoder layer `num_layers` [1, N, H] (= output_hidden_states[num_layers] of a full forward). Causal among
    the N new tokens, every cached position visible; the layers append their keys and values to `cache`."""
    from transformers.masking_utils import create_causal_mask

    decoder = model.get_decoder()
    position_ids = positions[None]  # [1, N]
    mask = create_causal_mask(config=model.config, inputs_embeds=hidden, attention_mask=None, cache=cache,
                              position_ids=position_ids)
    rotary = decoder.rotary_emb(hidden, position_ids=position_ids)
    for layer in decoder.layers[:num_layers]:
        hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=True,
                       position_embeddings=rotary)
    return hidden
