"""Run the frozen target and keep the hidden states a draft reads (online features).

The states are taken with forward pre-hooks on the decoder layers that a draft reads, not with
`output_hidden_states` (which keeps all L + 1 states: 2.2 GB for Llama-3.1-8B at 8192 tokens)."""
from __future__ import annotations

import contextlib
import functools
from typing import Dict, Iterable, List, Optional

import torch

from specdraft.core.types import TargetFeatures
from specdraft.targets.head_forms import logit_softcap

CAUSAL_SDPA = "specdraft_causal_sdpa"
"""The attention a right-padded target forward runs under: SDPA's causal kernel with no mask at all."""


def _causal_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


@functools.cache
def _register_causal_sdpa() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(CAUSAL_SDPA, _causal_sdpa)


def _full_causal_sdpa(config) -> bool:
    """Whether every layer of the target attends causally to the whole prefix with SDPA (no sliding window).

    A config that sets `sliding_window` counts as windowed whatever its `layer_types` say: Mistral, Mixtral and
    Qwen3-MoE window every layer by it alone (no layer_types), Qwen2 and Qwen3 clear it unless use_sliding_window,
    and Gemma 3's local layers read it (named in layer_types)."""
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return config._attn_implementation == "sdpa" and layer_types == {"full_attention"} \
        and getattr(config, "sliding_window", None) is None


@contextlib.contextmanager
def causal_attention(model):
    """The target's SDPA attention as plain causal attention while the block runs.

    Hugging Face reads a mask back to the host before every forward, to find whether it may skip it: the padding
    mask's `.all()`, or without one, whether the position ids hold packed sequences. Each read waits for the
    device to finish all queued work (in training: the previous step), and the device then idles while the host
    launches the next kernels. An attention implementation with no mask function of its own skips that
    preprocessing (create_causal_mask returns None). Targets with sliding windows, or not on SDPA, run as they are."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not _full_causal_sdpa(config):
        yield
        return
    _register_causal_sdpa()
    previous, config._attn_implementation = config._attn_implementation, CAUSAL_SDPA
    try:
        yield
    finally:
        config._attn_implementation = previous


@contextlib.contextmanager
def torch_linear():
    """`torch.nn.functional.linear` as PyTorch's own op while the block runs.

    DeepSpeed's ZeRO-3 (its default `memory_efficient_linear`) replaces it process-wide with an autograd Function,
    whose every call binds its arguments with `inspect.signature` on the host. The frozen target runs under
    no_grad, where that Function saves nothing for a backward, yet its 7 linears per layer paid it on every step:
    46% of the target forward's host time on a CPU (`python -m tools.bench.scale target-linear`). On an H100 the ZeRO-3 step was
    no faster (docs/benchmarks.md): there the target's part is bound by the GPU. A ZeRO-3-partitioned
    target is unaffected: its module hooks, not the linear, gather its weights."""
    import torch.nn.functional as F

    replaced = F.linear
    if replaced is torch._C._nn.linear:
        yield
        return
    F.linear = torch._C._nn.linear
    try:
        yield
    finally:
        F.linear = replaced


def _keep_input(store: Dict[int, torch.Tensor], index: int):
    def hook(module, args, kwargs):
        store[index] = args[0] if args else kwargs["hidden_states"]
    return hook


def run_decoder(decoder, input_ids, attention_mask, position_ids, keep: List[int]):
    """-> ({i: [B, T, H]} for i in keep, final normed hidden state [B, T, H])."""
    if position_ids is not None:  # no attention mask: Hugging Face masks per document from the position ids
        inputs = {"input_ids": input_ids, "position_ids": position_ids}
    elif attention_mask is None:  # right-padded rows: causal attention alone (the caller's causal_attention)
        inputs = {"input_ids": input_ids}
    else:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    return decoder_states(decoder, inputs, keep)


def decoder_states(decoder, inputs: Dict[str, torch.Tensor], keep: List[int]):
    """The decoder (a language model without its LM head) on `inputs` (its forward's keyword arguments:
    input_ids or inputs_embeds, and masks or position ids) -> ({i: input of layer i, [B, T, H]} for i in keep,
    final normed hidden state [B, T, H]), taken with pre-hooks on the layers read."""
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
def capture_features(model, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], layers: Iterable[int],
                     position_ids: Optional[torch.Tensor] = None) -> TargetFeatures:
    """input_ids, attention_mask [B, T] -> hidden states {i: [B, T, H]} for i in layers (0 always), the final
    normed hidden state and the LM head weight. The decoder runs without its LM head: no [B, T, V] logits.

    attention_mask None: each row's padding (if any) is at its end. Causal attention then never lets a real
    token see a padded one, so the real tokens' states are those the mask would give, without it; the target runs
    under `causal_attention`, so that the forward never waits for the device.

    position_ids [B, T] (packed rows, positions restarting at each document) replaces the attention mask: the
    target then attends within each document only. Its linears run as PyTorch's own (`torch_linear`)."""
    keep = sorted(set(layers) | {0})
    unmasked = attention_mask is None and position_ids is None
    with causal_attention(model) if unmasked else contextlib.nullcontext(), torch_linear():
        hidden_states, final_hidden = run_decoder(model.get_decoder(), input_ids, attention_mask, position_ids, keep)
    return TargetFeatures(hidden_states=hidden_states, final_hidden=final_hidden,
                          lm_head=model.get_output_embeddings().weight, logit_softcap=logit_softcap(model.config),
                          embed_tokens=model.get_input_embeddings().weight)


def embeddings_from_table(model, input_ids: torch.Tensor) -> bool:
    """Whether the embedding table alone (its rows, as offline training looks them up) gives hidden_states[0] for
    input_ids [1, T]. A target that scales its embeddings (Gemma, inside its embedding module) does not: then
    stored features must keep index 0."""
    stored = capture_features(model, input_ids, torch.ones_like(input_ids), [0]).hidden_states[0]  # [1, T, H]
    looked_up = torch.nn.functional.embedding(input_ids, model.get_input_embeddings().weight)  # [1, T, H]
    return torch.equal(stored, looked_up.to(stored.dtype))


def layers_to_store(spec, method_cfg, info, model) -> list:
    """Hidden-state indices that stored (offline) features need: the method's, plus 0 when it reads the token
    embeddings and the embedding table cannot recompute them."""
    layers = set(spec.feature_layers(method_cfg, info))
    probe = torch.arange(8, device=model.get_input_embeddings().weight.device)[None]  # [1, 8]
    if spec.reads_embeddings and not embeddings_from_table(model, probe):
        layers.add(0)
    return sorted(layers)
