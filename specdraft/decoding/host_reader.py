"""Reads of small device tensors back to the host that do not wait for the whole device."""
from __future__ import annotations

from typing import List

import torch


class HostReader:
    """Copies of small device tensors to the host that do not wait for the device: a ring of two buffers (pinned
    on a GPU), each with an event, so a step can be read while the next one runs. `stage` queues a copy and
    returns its slot; `read` waits for that copy alone. A slot is free again once read."""

    def __init__(self, size: int, device: torch.device):
        pinned = device.type == "cuda"
        self.buffers = [torch.zeros(size, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.events = [torch.cuda.Event() if pinned else None for _ in range(2)]
        self.next_slot = 0

    def stage(self, values: torch.Tensor) -> int:
        """values [n] (long, n <= size) on the device -> the slot its copy goes to."""
        slot, self.next_slot = self.next_slot, 1 - self.next_slot
        self.buffers[slot][:values.numel()].copy_(values, non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()
        return slot

    def read(self, slot: int, count: int) -> List[int]:
        """The first `count` values staged in `slot`, once their copy is done."""
        if self.events[slot] is not None:
            self.events[slot].synchronize()
        return self.buffers[slot][:count].tolist()
