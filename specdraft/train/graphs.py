"""A training step's forward and backward as one CUDA graph (train.cuda_graphs): the host launches it in one call.

A small draft's step (SmolLM2's EAGLE-3 head: the target's 30 layers, 7 TTT steps forward and backward) is
thousands of short kernels; launched one by one from Python the device idles between them. `StepGraphs` runs the
loss (the frozen target's forward included) and `torch.autograd.grad` of it under CUDA graph capture, once per
batch shape, then replays that graph for every later batch of the shape: the batch is copied into the graph's
input buffers, one replay computes the loss, the metrics and every parameter's gradient into its output buffers.

What it hands back is an ordinary LossOutput: its loss is a `_ReplayedLoss` node whose backward passes the
replayed gradients (times the incoming gradient: Lightning's accumulation scaling) to the parameters, so the
trainer's backward, gradient accumulation, clipping and optimizer (outside the graph: the LR schedule changes on
the host) run as they do eagerly. The first `warmup` batches of a shape run eagerly (torch.compile's compiles,
Triton's first launches), one more runs on a side stream before the capture, as CUDA graphs need.

A capture needs the step to read nothing back to the host and to keep its shapes for a given batch shape; a
capture that fails falls back to eager steps (train.cuda_graphs=auto) or stops with an error naming the key
(true). Graphs of every shape share one memory pool (replays never overlap, and each graph's outputs stay
allocated while the others replay) and one set of gradient buffers: more shapes cost little memory.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from specdraft.core.errors import SpecdraftError
from specdraft.core.types import LossOutput

log = logging.getLogger(__name__)

GRAPHS_KEY = "train.cuda_graphs"
GRAPH_CHECKPOINTING = ("none", "swiglu")
"""Activation checkpointing modes a capture runs: selective and full use torch.utils.checkpoint, which reads
the CUDA RNG state in the forward (no capture reads it)."""


@dataclass
class GraphNeeds:
    """What train.cuda_graphs needs of a run, each false with the reason it is not met."""

    cuda: bool
    single_device: bool
    strategy: str
    checkpointing: str
    features_graph_safe: bool
    method_graph_safe: bool
    unpacked_rows: bool = True
    offload: bool = False

    def unmet(self) -> List[str]:
        checks = [(self.cuda, "a CUDA device"), (self.single_device, "one device (not DDP)"),
                  (not self.strategy.startswith("deepspeed"), f"no DeepSpeed strategy (got {self.strategy})"),
                  (self.checkpointing in GRAPH_CHECKPOINTING,
                   f"train.activation_checkpointing in {list(GRAPH_CHECKPOINTING)} (got {self.checkpointing})"),
                  (self.features_graph_safe, "data.features=online on a text target, not sharded"),
                  (self.method_graph_safe, "a method whose loss declares graph_safe_loss"),
                  (self.unpacked_rows, "unpacked rows (data.pack_length=null: with packed rows the target reads "
                                       "their position ids back to the host)"),
                  (not self.offload, "train.activation_offload=false (its copies to the host are not capturable)")]
        return [reason for met, reason in checks if not met]


def graphs_enabled(setting: str, needs: GraphNeeds) -> bool:
    """train.cuda_graphs (auto, true, false) resolved: auto captures wherever `needs` are all met; true is an
    error naming the first unmet one."""
    if setting == "false":
        return False
    unmet = needs.unmet()
    if unmet and setting == "true":
        raise SpecdraftError(f"{GRAPHS_KEY}=true needs {unmet[0]}; set {GRAPHS_KEY}=auto or false")
    log.info("%s=%s: %s", GRAPHS_KEY, setting, "captured" if not unmet else f"eager (needs {', '.join(unmet)})")
    return not unmet


class _ReplayedLoss(torch.autograd.Function):
    """The replayed loss as an autograd node over the parameters: its backward gives each one its replayed
    gradient scaled by the incoming one (1, or 1/N under gradient accumulation)."""

    @staticmethod
    def forward(ctx, loss, grads, *params):
        ctx.grads = grads
        return loss.detach().clone()

    @staticmethod
    def backward(ctx, grad_output):
        return (None, None, *(None if grad is None else grad * grad_output for grad in ctx.grads))


@dataclass
class Captured:
    """One batch shape's graph: its input buffers (the batch's flattened leaves, None where the batch has None)
    and output buffers (loss [], the metrics stacked [M] float32, one gradient per parameter or None)."""

    replay: Callable[[], None]
    inputs: List[Optional[torch.Tensor]]
    loss: torch.Tensor
    metric_names: List[str]
    metrics: torch.Tensor
    grads: Tuple[Optional[torch.Tensor], ...]


class NotCapturable(Exception):
    """The loss gives something a replay cannot reproduce (a metric computed on the host)."""


def cuda_capture(run: Callable[[], tuple], pool) -> Tuple[Callable[[], None], tuple]:
    """`run` once on a side stream (what capture needs first), then captured -> (replay, its output buffers)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):  # the pin-memory thread allocates
        outputs = run()
    return graph.replay, outputs


def rerun_capture(run: Callable[[], tuple], pool=None) -> Tuple[Callable[[], None], tuple]:
    """cuda_capture's stand-in off CUDA (tests): a replay runs `run` again and copies its outputs into the
    buffers the first run returned, as a graph's replay rewrites its outputs."""
    outputs = run()

    def replay():
        for buffer, value in zip(tree_flatten(outputs)[0], tree_flatten(run())[0]):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)
    return replay, outputs


def _shape_key(leaves: Sequence, spec) -> tuple:
    return (str(spec), *((None if leaf is None else (tuple(leaf.shape), leaf.dtype, leaf.device)) for leaf in leaves))


class StepGraphs:
    """`loss_fn(batch) -> LossOutput` with its forward and backward captured per batch shape (the module
    docstring). `params`: what the gradients are taken of (the optimizer's). `strict`: a capture failure is an
    error (train.cuda_graphs=true) instead of eager steps from then on. `capture`: cuda_capture, or
    rerun_capture to run the same bookkeeping off CUDA."""

    def __init__(self, loss_fn: Callable[[Dict], LossOutput], params: Sequence[torch.Tensor], warmup: int = 2,
                 max_graphs: int = 16, strict: bool = False, capture=cuda_capture):
        self.loss_fn, self.params, self.warmup, self.max_graphs = loss_fn, list(params), warmup, max_graphs
        self.strict, self.capture = strict, capture
        self.graphs: Dict[tuple, Captured] = {}
        self.seen: Dict[tuple, int] = {}
        self.failed: Optional[str] = None
        self.pool = torch.cuda.graph_pool_handle() if capture is cuda_capture else None
        self.grad_buffers: Optional[List[torch.Tensor]] = None
        """Every graph's gradients land in these, made once outside the graphs' pool: one set for all shapes."""

    def __call__(self, batch: Dict) -> LossOutput:
        leaves, spec = tree_flatten(batch)
        if self.failed or not all(leaf is None or isinstance(leaf, torch.Tensor) for leaf in leaves):
            return self.loss_fn(batch)
        key = _shape_key(leaves, spec)
        captured = self.graphs.get(key)
        if captured is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= self.warmup or len(self.graphs) >= self.max_graphs:
                return self.loss_fn(batch)
            captured = self._capture(key, leaves, spec)
            if captured is None:
                return self.loss_fn(batch)
        return self._replay(captured, leaves)

    def _replay(self, captured: Captured, leaves: Sequence) -> LossOutput:
        for buffer, value in zip(captured.inputs, leaves):
            if buffer is not None:
                buffer.copy_(value, non_blocking=True)
        captured.replay()
        loss = _ReplayedLoss.apply(captured.loss, captured.grads, *self.params)
        metrics = dict(zip(captured.metric_names, captured.metrics.clone().unbind()))  # one copy for all
        return LossOutput(loss=loss, metrics=metrics)

    def _forward_backward(self, batch: Dict) -> tuple:
        """The loss, its metrics stacked, and the parameters' gradients: what a graph computes. Autocast's cached
        casts of the weights are dropped first: a capture that found one from an earlier run would record no cast,
        and every replay would read that run's weights. (Autocast without its cache would do too, but torch.compile
        guards on that setting: every compiled part would compile again.)"""
        torch.clear_autocast_cache()
        result = self.loss_fn(batch)
        names = sorted(result.metrics)
        if not all(isinstance(result.metrics[name], torch.Tensor) for name in names):
            raise NotCapturable("a metric of the loss is a host value")
        metrics = torch.stack([result.metrics[name].detach().float().reshape(()) for name in names]) if names \
            else result.loss.detach().float().new_zeros(0)
        grads = torch.autograd.grad(result.loss, self.params, allow_unused=True)
        for buffer, grad in zip(self.grad_buffers, grads):
            if grad is not None:
                buffer.copy_(grad)
        kept = [None if grad is None else buffer for buffer, grad in zip(self.grad_buffers, grads)]
        return result.loss.detach(), names, metrics, kept

    def _capture(self, key: tuple, leaves: Sequence, spec) -> Optional[Captured]:
        inputs = [None if leaf is None else leaf.detach().clone() for leaf in leaves]  # outside the graph's pool
        if self.grad_buffers is None:
            self.grad_buffers = [torch.empty_like(param) for param in self.params]
        batch = tree_unflatten(inputs, spec)
        try:
            replay, (loss, names, metrics, grads) = self.capture(lambda: self._forward_backward(batch), self.pool)
        except Exception as err:  # CUDA's refusal, out of memory, torch.compile's error inside the capture
            self._give_up(err)
            return None
        self.graphs[key] = Captured(replay, inputs, loss, names, metrics, tuple(grads))
        log.info("%s: captured the training step for batch shape %s (%d graphs)", GRAPHS_KEY,
                 [tuple(leaf.shape) for leaf in inputs if leaf is not None], len(self.graphs))
        return self.graphs[key]

    def _give_up(self, err: Exception) -> None:
        first_line = (str(err).strip().splitlines() or [""])[0][:300]
        self.failed = f"{type(err).__name__}: {first_line}"
        if self.strict or not self._device_usable():
            raise SpecdraftError(f"capturing the training step in a CUDA graph failed ({self.failed}); set "
                                 f"{GRAPHS_KEY}=false to train eagerly") from err
        log.warning("%s=auto: capturing the training step failed (%s); training eagerly", GRAPHS_KEY, self.failed)

    @staticmethod
    def _device_usable() -> bool:
        """Whether the device still runs work after a failed capture (an invalidated capture is not sticky)."""
        try:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return True
        except RuntimeError:
            return False
