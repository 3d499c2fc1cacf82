"""Kernel launches, counted on the CPU: every ATen op that computes (views, metadata and allocations launch no
kernel) plus every Triton kernel run under the interpreter (TRITON_INTERPRET=1), whose own host copies are not
counted. A small target's decode is bound by its launches (docs/benchmarks.md has a graphed cycle's time a
launch), so a step's count is a first-order model of its GPU time that a CPU can check.

    with LaunchCounter() as counter:
        engine.decode_plain(...)
    counter.launches  # ["mm", "triton:_rms_norm_kernel", ...]
    counter.syncs  # ["nonzero", ...]: the ops among them that make the host wait for the device on a GPU

A host sync is a read of a value (`.item()`, a tensor in an `if`, `torch.equal`) or an op whose output's shape
depends on the values (`nonzero`, boolean indexing, `masked_select`, `unique`): a CUDA graph cannot hold either.
"""
from __future__ import annotations

from typing import List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NO_LAUNCH = {"view", "_unsafe_view", "t", "transpose", "split", "split_with_sizes", "slice", "select", "expand",
             "unsqueeze", "squeeze", "permute", "as_strided", "alias", "detach", "empty", "empty_like",
             "empty_strided", "new_empty", "_reshape_alias", "lift_fresh", "set_", "unbind", "chunk"}
SYNCS = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "unique", "_unique", "_unique2",
         "unique_consecutive", "unique_dim", "bincount", "repeat_interleave"}
"""Ops that wait for the device (`repeat_interleave` with a tensor of repeats and no output size among them)."""


def _is_sync(name: str, args, kwargs) -> bool:
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # boolean indices: a nonzero inside
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
    if name == "repeat_interleave":  # a tensor of repeats sizes the output, unless output_size is given
        repeats = args[1] if len(args) > 1 else args[0]
        return isinstance(repeats, torch.Tensor) and (kwargs or {}).get("output_size") is None
    return name in SYNCS


class LaunchCounter(TorchDispatchMode):
    """Appends each launch's name to `launches` while entered; Triton kernels as `triton:<kernel name>`, the ATen
    ops inside a Triton launch (the interpreter's) not at all."""

    def __init__(self):
        super().__init__()
        self.launches: List[str] = []
        self.syncs: List[str] = []
        self._inside_triton = 0
        self._restore = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self._inside_triton and name not in NO_LAUNCH:
            self.launches.append(name)
        if not self._inside_triton and _is_sync(name, args, kwargs):
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._hook_triton()
        return super().__enter__()

    def __exit__(self, *exc):
        if self._restore is not None:
            self._restore()
            self._restore = None
        return super().__exit__(*exc)

    def _hook_triton(self) -> None:
        try:
            from triton.runtime.interpreter import GridExecutor
        except ImportError:  # no Triton: every launch is an ATen op
            return
        launch, counter = GridExecutor.__call__, self

        def counted(executor, *args, **kwargs):
            counter.launches.append(f"triton:{executor.fn.__name__}")
            counter._inside_triton += 1
            try:
                return launch(executor, *args, **kwargs)
            finally:
                counter._inside_triton -= 1

        GridExecutor.__call__ = counted
        self._restore = lambda: setattr(GridExecutor, "__call__", launch)
