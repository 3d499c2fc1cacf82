"""P-EAGLE's head: EAGLE-3's (fc, one decoder layer, final norm, LM head over the draft vocabulary) plus the learned
stand-in for the target's features at mask positions (`mask_hidden`, in the features' own space: it goes through
fc_norm and fc as they do), and that layer's forward over a batch's rollout rows in one call."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from specdraft.core.types import DraftContext
from specdraft.kernels.rollout_attention import RolloutMask, rollout_attention
from specdraft.layers.compile import maybe_compiled
from specdraft.layers.decoder_parts import attention_inputs, attention_residual, mlp_residual
from specdraft.layers.zero import register_external
from specdraft.methods.eagle3 import Eagle3DecoderLayer, Eagle3Draft
from specdraft.methods.peagle.config import PEagleConfig, resolve_mask_token


class MaskInput(nn.Module):
    """mask_hidden [1, 1, A*H]: what the mask positions read in place of the target's A feature layers (drawn from
    N(0, 1), as speculators and SpecForge draw it). A module of its own so that ZeRO-3 gathers it for its forward."""

    def __init__(self, width: int):
        super().__init__()
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, width))

    def forward(self) -> torch.Tensor:  # -> [1, 1, A*H], a copy: ZeRO-3 releases the parameter after this call
        return self.mask_hidden.clone()


class PEagleDraft(Eagle3Draft):
    """EAGLE-3's head drafting `num_depths` tokens in one forward: depth 1 from the prefix's last column (EAGLE-3's
    step 0), depths 2..K from mask rows (the mask token's embedding, mask_hidden through fc) that attend to the
    prefix and to the mask rows before them."""

    def __init__(self, cfg: PEagleConfig, ctx: DraftContext):
        super().__init__(cfg, ctx)
        self.num_depths = cfg.num_depths
        self.mask_token_id = resolve_mask_token(cfg, ctx.target)
        self.mask_input = MaskInput(len(self.feature_layers) * ctx.target.hidden_size)
        self.rollout = RolloutRunner(self.midlayer)

    def mask_hidden_input(self) -> torch.Tensor:
        """The mask rows' hidden input: mask_hidden through fc_norm and fc -> [1, 1, H]."""
        return self.fuse(self.mask_input())


class RolloutRunner(nn.Module):
    """The draft's decoder layer over rollout rows as a module call of its own (`rollout_layer`): under ZeRO-3 the
    call gathers the layer's weights, registered with it, as the layer's own call does. It holds no weights."""

    def __init__(self, layer: Eagle3DecoderLayer):
        super().__init__()
        object.__setattr__(self, "layer", layer)  # not a submodule: the weights stay the midlayer's
        register_external(self, layer.parameters())

    def forward(self, hidden, embeds, positions=None, mask: Optional[RolloutMask] = None, full_checkpoint=False):
        """hidden, embeds [B, L, H] (positional: ZeRO-3 wraps positional tensors only); positions [B, L]."""
        run = checkpointed_rollout_layer if full_checkpoint else rollout_layer
        return run(self.layer, hidden, embeds, positions, mask)


def rollout_layer(layer: Eagle3DecoderLayer, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                  mask: RolloutMask, weights=None) -> torch.Tensor:
    """EAGLE-3's decoder layer over rollout rows (Eagle3DecoderLayer.forward with rollout attention in place of
    TTT attention): hidden, embeds [B, L, H]; positions [B, L] rotary positions -> [B, L, H]. Activation
    checkpointing (the layer's `checkpointing`, set by eagle3.configure_layers) and compiled parts as there."""
    weights = weights or layer.compute_weights()
    q, k, v = maybe_compiled(attention_inputs, layer.compiled)(layer, hidden, embeds, positions, weights.qkv)
    attended = rollout_attention(q, k, v, mask)  # [B, h, L, D]
    hidden = maybe_compiled(attention_residual, layer.compiled)(hidden, attended, weights.o)
    if layer.checkpointing == "selective" and torch.is_grad_enabled():
        return checkpoint(_recast_mlp_residual, layer, hidden, use_reentrant=False)
    return maybe_compiled(mlp_residual, layer.compiled)(layer, hidden, weights.gate_up, weights.down)


def _recast_mlp_residual(layer: Eagle3DecoderLayer, hidden: torch.Tensor) -> torch.Tensor:
    """The MLP with its weights cast here: selective recomputes the casts with it, keeping none."""
    weights = layer.compute_weights()
    return maybe_compiled(mlp_residual, layer.compiled)(layer, hidden, weights.gate_up, weights.down)


def checkpointed_rollout_layer(layer: Eagle3DecoderLayer, hidden, embeds, positions, mask: RolloutMask):
    """rollout_layer under full activation checkpointing: its activations are recomputed in the backward."""
    return checkpoint(rollout_layer, layer, hidden, embeds, positions, mask, use_reentrant=False)
