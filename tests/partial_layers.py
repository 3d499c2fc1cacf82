"""Run only the first layers of a Hugging Face decoder, with their own KV cache: what the Kangaroo oracle chain
drafter (tests/oracles.py) runs on each drafted token. The runtime has its own target (`run_layers`)."""
from __future__ import annotations

import inspect

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
    cache_name = _cache_keyword(create_causal_mask)  # transformers renamed past_key_values to cache in 5.2x
    mask_args = {"config": model.config, "attention_mask": None, cache_name: cache, "position_ids": position_ids}
    mask_params = inspect.signature(create_causal_mask).parameters
    mask_args["inputs_embeds" if "inputs_embeds" in mask_params else "input_embeds"] = hidden
    if "cache_position" in mask_params:
        mask_args["cache_position"] = positions
    mask = create_causal_mask(**mask_args)
    rotary = decoder.rotary_emb(hidden, position_ids=position_ids)
    layer_cache = {_cache_keyword(type(decoder.layers[0]).forward): cache}
    for layer in decoder.layers[:num_layers]:
        hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=True,
                       position_embeddings=rotary, **layer_cache)
    return hidden[0] if isinstance(hidden, tuple) else hidden


def _cache_keyword(fn) -> str:
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"
