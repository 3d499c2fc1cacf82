"""Matmul weights in the dtype they compute in, cast once and shared by every use in a forward.

Under autocast, eager PyTorch caches one low-precision copy of each float32 weight for the autocast region;
inside a torch.compile'd region the cast is part of the graph instead, and each call keeps its own copy for
the backward. Casting outside the compiled code and passing the copy in keeps one, as eager does."""
from __future__ import annotations

import torch


def compute_weight(*weights: torch.Tensor) -> torch.Tensor:
    """weights [out_i, in] joined along the output dimension -> [sum(out_i), in], in autocast's dtype where it
    is on (a differentiable copy: gradients reach the float32 parameters through it), else as they are (one
    weight: itself)."""
    device = weights[0].device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        weights = tuple(weight.to(dtype) for weight in weights)
    return weights[0] if len(weights) == 1 else torch.cat(weights)


class UnrollCasts:
    """Each layer's compute weights (its `compute_weights()`), built at the layer's first step of one TTT unroll
    and shared by the later ones, as eager autocast's cache would share them."""

    def __init__(self):
        self.by_layer = {}

    def __call__(self, layer):
        if layer not in self.by_layer:
            self.by_layer[layer] = layer.compute_weights()
        return self.by_layer[layer]
