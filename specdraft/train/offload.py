"""Activation offloading (train.activation_offload): what the draft's forward keeps for its backward moves to host
memory as the forward makes it and comes back as the backward needs it.

At long sequences the draft's kept activations dominate GPU memory (EAGLE-3 at Llama-3.1-8B shapes keeps about
120 kB a token and TTT step: 55 GB at 65,536 tokens and 7 steps) while the host holds hundreds of GB. `Offload`
installs saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) around the step's loss: a kept tensor of at
least `min_bytes` that is not a parameter is copied into pinned host memory on a side stream (the forward goes on;
the copy's memory is released once it is done), and copied back on the backward's stream when the backward asks
for it. Parameters and small tensors stay where they are (their copies would cost more than they free).

It trades PCIe time (about 2 x the offloaded bytes a step) for memory, so it pays where a sequence would not fit
otherwise; the GPU memory beyond the weights then grows with the largest tensor a step keeps, not with all of
them. On a CPU the hooks keep tensors as they are (nothing to offload to): the path runs, the bytes are counted.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch

MIN_BYTES = 1 << 20
"""Tensors smaller than this stay on the device (launch and pinning costs exceed what they free)."""


@dataclass
class _Held:
    """One offloaded tensor: its host copy, the event its copy recorded, where it came from."""
    host: torch.Tensor
    copied: Optional[torch.cuda.Event]
    device: torch.device


@dataclass
class Offload:
    """Saved-tensor hooks that move a step's large kept activations to pinned host memory and back."""

    min_bytes: int = MIN_BYTES
    offloaded_bytes: int = 0
    """Bytes moved to the host by the last `context` (what the device did not keep)."""
    _stream: Optional[torch.cuda.Stream] = field(default=None, repr=False)

    def wants(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is worth moving: a large activation, not a parameter or a leaf that keeps its grad."""
        if isinstance(tensor, torch.nn.Parameter) or (tensor.is_leaf and tensor.requires_grad):
            return False
        return tensor.numel() * tensor.element_size() >= self.min_bytes

    def pack(self, tensor: torch.Tensor):
        if not self.wants(tensor):
            return tensor
        self.offloaded_bytes += tensor.numel() * tensor.element_size()
        if tensor.device.type != "cuda":
            return _Held(tensor, None, tensor.device)
        stream = self._side_stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))  # the tensor is complete before the copy
        with torch.cuda.stream(stream):
            host = torch.empty(tensor.shape, dtype=tensor.dtype, layout=tensor.layout, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)
        tensor.record_stream(stream)  # its memory is reused only after the copy
        return _Held(host, copied, tensor.device)

    @staticmethod
    def unpack(packed):
        if not isinstance(packed, _Held):
            return packed
        if packed.copied is None:
            return packed.host
        torch.cuda.current_stream(packed.device).wait_event(packed.copied)
        return packed.host.to(packed.device, non_blocking=True)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._stream is None or self._stream.device != device:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    @contextlib.contextmanager
    def context(self) -> Iterator["Offload"]:
        """Offload what the forward run inside keeps (its backward, run later anywhere, brings it back)."""
        self.offloaded_bytes = 0
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield self

