"""CUDA graphs' aliasing on the CPU, for tests of the graphed engine paths without a GPU; and what a capture relies
on: that the tensors it read outlive it (CaptureOnCpu)."""
import dataclasses
import gc
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


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

    def ready(self):
        """CallGraph.ready's stand-in: nothing to capture on the CPU (the first call sets the outputs)."""
        return self


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


class _GraphRun(TorchDispatchMode):
    """A graph body's run: every tensor its ops make joins `owned` (on a GPU, the graph's own memory: captured
    outputs live as long as the graph, and a replay writes the same ones); with `record`, every tensor its ops read
    that neither they nor another graph made is kept in `external` ({storage address: (weak reference to the
    tensor or its view's base, shape, op)})."""

    def __init__(self, owned: weakref.WeakValueDictionary, record: bool):
        super().__init__()
        self.owned, self.record, self.made, self.external = owned, record, set(), {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.record:
            for tensor in _tensors((args, kwargs)):
                owner = tensor if tensor._base is None else tensor._base
                address = tensor.untyped_storage().data_ptr()
                if address not in self.made and address not in self.external and self.owned.get(id(owner)) is not owner:
                    self.external[address] = (weakref.ref(owner), tuple(tensor.shape), str(func))
        out = func(*args, **kwargs)
        for tensor in _tensors(out):
            self.made.add(tensor.untyped_storage().data_ptr())
            owner = tensor if tensor._base is None else tensor._base
            self.owned[id(owner)] = owner
        return out


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.numel()]


class CaptureOnCpu(ReplayOnCpu):
    """ReplayOnCpu that also checks what a CUDA graph's capture relies on: the tensors it reads that were made
    outside every graph (caches, weights, constants) are read at their capture addresses by every replay, so they
    must outlive the graph. Like CallGraph, the first call runs the body `warmup` times, restores the state, then
    "captures" (runs it once more, recording those tensors); `freed_reads()` lists the ones gone since."""

    graphs: list = []  # every instance made (a test that patches CaptureOnCpu in resets both)
    owned = weakref.WeakValueDictionary()  # {id: tensor} the graph bodies made (the graphs' own memory on a GPU)

    def __init__(self, fn, state, example=(), warmup=2):
        super().__init__(fn, state, example)
        self.state, self.warmup, self.reads = state, warmup, None
        CaptureOnCpu.graphs.append(self)

    def __call__(self, *args):
        if self.reads is not None:
            with _GraphRun(CaptureOnCpu.owned, record=False):
                return super().__call__(*args)
        for static, value in zip(self.inputs, args):
            static.copy_(value)
        saved = [t.clone() for t in self.state]
        for _ in range(self.warmup):  # outside the graph: what it makes is the process's, not the graph's
            self.fn(*self.inputs)
        for tensor, value in zip(self.state, saved):
            tensor.copy_(value)
        with _GraphRun(CaptureOnCpu.owned, record=True) as run:
            self.output = self.fn(*self.inputs)
        self.reads = run.external
        return self.output

    @classmethod
    def freed_reads(cls):
        """(shape, first op) of each tensor made outside the graphs that a captured graph read and that has been
        freed since."""
        gc.collect()
        return [(shape, op) for graph in cls.graphs for ref, shape, op in (graph.reads or {}).values() if ref() is None]
