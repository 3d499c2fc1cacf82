"""Counting the reads of tensor values back to the host (`.item()`, a tensor in an `if`, `torch.equal`): on a GPU
each one waits for the device to finish all queued work. A dispatch mode sees them on the CPU too."""
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default}


class HostReads(TorchDispatchMode):
    """Counts host reads. With `only_from`, only those whose call stack passes through a frame whose
    "path:function" contains one of those strings; with `unless_from`, none whose stack passes through one of
    those (reads of values that stay on the CPU on a GPU machine too). `count` is the total, `by_step[step]` the
    count while `step` was set (-1 before)."""

    def __init__(self, only_from: tuple = (), unless_from: tuple = ()):
        super().__init__()
        self.only_from, self.unless_from = only_from, unless_from
        self.count, self.step, self.by_step = 0, -1, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READS and self._counted():
            self.count += 1
            self.by_step[self.step] = self.by_step.get(self.step, 0) + 1
        return func(*args, **(kwargs or {}))

    def _counted(self) -> bool:
        if not self.only_from and not self.unless_from:
            return True
        frames = [f"{frame.filename}:{frame.name}" for frame in traceback.extract_stack()]
        if any(part in frame for frame in frames for part in self.unless_from):
            return False
        return not self.only_from or any(part in frame for frame in frames for part in self.only_from)
