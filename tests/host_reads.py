"""Counting the reads of tensor values back to the host (`.item()`, a tensor in an `if`, `torch.equal`): on a GPU
each one waits for the device to finish all queued work. A dispatch mode sees them on the CPU too.

Two more kinds wait on a GPU without a read the mode sees at the top level: ops whose CUDA kernel reads a tensor
argument back itself (`masked_fill_` with a tensor value: `value.item()` inside the kernel), counted as reads;
and tensors built from host data (`torch.tensor(..., device=cuda)`: a blocking copy the host waits for), counted
as `uploads` (on the CPU every `torch.tensor` is one: count them where no host tensor is expected)."""
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
READS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default,
         aten.masked_fill_.Tensor, aten.masked_fill.Tensor}
UPLOADS = {aten.lift_fresh.default}


class HostReads(TorchDispatchMode):
    """Counts host reads (and uploads). With `only_from`, only those whose call stack passes through a frame whose
    "path:function" contains one of those strings; with `unless_from`, none whose stack passes through one of
    those (reads of values that stay on the CPU on a GPU machine too). `count` is the total, `by_step[step]` the
    count while `step` was set (-1 before); `uploads` the tensors built from host data."""

    def __init__(self, only_from: tuple = (), unless_from: tuple = ()):
        super().__init__()
        self.only_from, self.unless_from = only_from, unless_from
        self.count, self.uploads, self.step, self.by_step = 0, 0, -1, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READS and self._counted():
            self.count += 1
            self.by_step[self.step] = self.by_step.get(self.step, 0) + 1
        elif func in UPLOADS and self._counted():
            self.uploads += 1
        return func(*args, **(kwargs or {}))

    def _counted(self) -> bool:
        if not self.only_from and not self.unless_from:
            return True
        frames = [f"{frame.filename}:{frame.name}" for frame in traceback.extract_stack()]
        if any(part in frame for frame in frames for part in self.unless_from):
            return False
        return not self.only_from or any(part in frame for frame in frames for part in self.only_from)
