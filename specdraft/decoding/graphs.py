"""CUDA graphs for a step function with static shapes: warm up, capture once, then replay.

The function reads its inputs from tensors that stay at one address (the engine's state, the caches and the
static copies of its arguments) and may update them in place; warm-up runs would advance that state, so it is
saved before them and restored before the capture.
"""
from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Sequence

import torch


class CallGraph:
    def __init__(self, fn: Callable, state: List[torch.Tensor], example: Sequence[torch.Tensor] = (),
                 warmup: int = 2):
        self.fn, self.state, self.warmup = fn, state, warmup
        self.inputs = [t.clone() for t in example]
        self.graph = None
        self.output = None

    def _capture(self) -> None:
        saved = [t.clone() for t in self.state]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                self.fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        for tensor, copy in zip(self.state, saved):
            tensor.copy_(copy)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = self.fn(*self.inputs)

    def ready(self) -> "CallGraph":
        """Captured now when it is not yet (its warm-up runs leave the state as it was; nothing is replayed), so that
        a later first call only replays it."""
        if self.graph is None:
            self._capture()
        return self

    def __call__(self, *args: torch.Tensor):
        for static, value in zip(self.inputs, args):
            static.copy_(value)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.output


class GraphCache:
    """An engine's CUDA graphs by key (any hashable: a cycle kind names its own), each made at its first request and
    captured at its first call. `use_graphs` off (a CPU, `--no-cuda-graphs`), `run` calls the function itself."""

    def __init__(self, use_graphs: bool):
        self.use_graphs = use_graphs
        self.graphs: Dict[Hashable, CallGraph] = {}

    def get(self, key: Hashable, fn: Callable, state: Callable[[], List[torch.Tensor]],
            example: Sequence[torch.Tensor] = ()) -> CallGraph:
        """The graph under `key`, made with fn and state() (the tensors fn mutates, read only when the graph is
        made) at the first request."""
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = CallGraph(fn, state(), example=example)
        return graph

    def run(self, key: Hashable, fn: Callable, args: Sequence[torch.Tensor], state: Callable[[], List[torch.Tensor]]):
        """fn(*args), replayed from its graph under `key` when graphs are on."""
        if not self.use_graphs:
            return fn(*args)
        return self.get(key, fn, state, args)(*args)

    def keys(self):
        return self.graphs.keys()
