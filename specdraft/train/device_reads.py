"""Device values read back without making the host wait: the training metrics and step times of the logged steps.

`.item()`, `float(tensor)` or `torch.cuda.synchronize()` inside a training step makes the host wait until the device
has run every kernel queued so far; the device then idles through the host work that follows (the optimizer's
launches, Lightning's bookkeeping, the next batch) until the next step's long kernels are queued. A `Deferred`
stash instead copies the values into pinned host memory without blocking and records a CUDA event behind the copy
(and behind the step's work); `ready()` hands back the stashes whose event has completed (a query, which never
waits), normally within the next step, and `ready(wait=True)` the rest at the end of the fit. Off CUDA, a stash
is ready at once.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional

import torch


@dataclass
class Stash:
    key: int
    """What the values belong to (the optimizer step)."""
    values: Dict[str, float]
    """Host numbers given with the stash; the device values join them once read."""
    names: List[str]
    """The device values' names, in the order of `host`."""
    host: Optional[torch.Tensor]
    """[len(names)] float32: pinned host memory the copy lands in (on CUDA), or the values themselves."""
    event: Optional[torch.cuda.Event]
    """Recorded behind the copy on CUDA (timing-enabled: `elapsed_ms` measures between stashes); None off CUDA."""


class Deferred:
    """Stashes of device values, handed back in order once their copies have landed."""

    def __init__(self):
        self.pending: Deque[Stash] = deque()

    def stash(self, key: int, device: torch.device, tensors: Dict[str, torch.Tensor],
              numbers: Optional[Dict[str, float]] = None) -> Stash:
        """Start reading `tensors` (one element each) back; `numbers` (host values) travel with them, and so do
        tensors that are not on `device` (read at once: on the host already)."""
        device = torch.device(device)
        numbers = dict(numbers or {})
        numbers.update({name: float(value) for name, value in tensors.items() if value.device.type != device.type})
        names = [name for name, value in tensors.items() if value.device.type == device.type]
        host = torch.stack([tensors[name].detach().float().reshape(()) for name in names]) if names else None
        event = None
        if device.type == "cuda":
            if host is not None:
                pinned = torch.empty(host.shape, dtype=torch.float32, pin_memory=True)
                host = pinned.copy_(host, non_blocking=True)
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        stash = Stash(key, numbers, names, host, event)
        self.pending.append(stash)
        return stash

    def ready(self, wait: bool = False) -> List[Stash]:
        """The stashes whose values have landed (all of them with `wait`), oldest first, values filled in."""
        done = []
        while self.pending and (wait or self.pending[0].event is None or self.pending[0].event.query()):
            stash = self.pending.popleft()
            if stash.event is not None and wait:
                stash.event.synchronize()  # without `wait`, its query said the device has passed it: no call at all
            if stash.host is not None:
                stash.values.update(zip(stash.names, stash.host.tolist()))
            done.append(stash)
        return done


def elapsed_ms(start: Stash, end: Stash) -> float:
    """Device time between two landed CUDA stashes' events, in ms."""
    return start.event.elapsed_time(end.event)


class SigtermFlag:
    """What Lightning (2.6) runs before every training step of a run on several ranks (`_broadcast_sigterm_tensor`
    of its training epoch loop), without its two host syncs: it builds the flag from a host list on the GPU (a
    copy the host waits for) and reads the broadcast back with `.item()`. Here the flag stays on the device and
    each broadcast is read one step later, once it has landed (a wait on an event long passed): every rank stops
    at the same step, one step after rank 0 saw SIGTERM, as Lightning's would (barrier, then SIGTERMException)."""

    def __init__(self, trainer):
        self.trainer, self.flag, self.reads = trainer, None, Deferred()

    def __call__(self) -> None:
        import torch.distributed as dist
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if any(stash.values["sigterm"] for stash in self.reads.ready(wait=True)):
            dist.barrier()
            raise SIGTERMException()
        device = self.trainer.strategy.root_device
        if self.flag is None:
            self.flag = torch.zeros(1, dtype=torch.int32, device=device)  # [1]
        self.flag.fill_(1 if self.trainer.received_sigterm else 0)
        dist.broadcast(self.flag, src=0)
        self.reads.stash(0, device, {"sigterm": self.flag})
