"""CUDA graphs' aliasing on the CPU, for tests of the graphed engine paths without a GPU."""
import dataclasses

import torch


class ReplayOnCpu:
    """A stand-in for CallGraph on the CPU with a graph's aliasing: inputs are copied into static tensors, and
    every replay writes its outputs into the tensors the first call returned."""

    def __init__(self, fn, state, example=()):
        self.fn, self.inputs, self.output = fn, [t.clone() for t in example], None

    def __call__(self, *args):
        for static, value in zip(self.inputs, args):
            static.copy_(value)
        out = self.fn(*self.inputs)
        self.output = out if self.output is None else copy_into(self.output, out)
        return self.output


def copy_into(static, value):
    """Writes `value` into the tensors of `static` (a tensor, a dataclass or a tuple of them) -> static."""
    if isinstance(static, torch.Tensor):
        return static.copy_(value)
    if dataclasses.is_dataclass(static):
        for f in dataclasses.fields(static):
            copy_into(getattr(static, f.name), getattr(value, f.name))
        return static
    if isinstance(static, (tuple, list)):
        return type(static)(copy_into(s, v) for s, v in zip(static, value))
    return static
