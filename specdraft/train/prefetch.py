"""The next batch's target features, computed on a side CUDA stream while the current step ends
(train.prefetch_features).

A training step runs on the compute stream in order: the frozen target's forward (the batch's features), the
draft's forward and backward, the gradients' reduction across the ranks (with overlap_comm off,
specdraft.train.deepspeed_step, ZeRO-2's reduce-scatter and all-gather run on that stream after the backward),
then the optimizer step. Nothing hides the reduction. `FeaturePrefetch` queues the next batch's target forward on
a side stream once the step's backward is enqueued: the module's `on_after_backward`, which Lightning calls after
DeepSpeed's `engine.backward` (whose end enqueues the reductions) and before `engine.step`. The device runs it
beside the rest of the step, and the next step finds its features computed.

Which batch comes next: the training loader's batches carry a sequence number (SEQ_KEY, a Python int, which
Lightning's transfer to the device passes through as it is) and are read one ahead (`track`), so that when step
n's backward is enqueued batch n + 1 is on the host. Lightning reads no batch ahead for a loader with a length
(ours): in lightning/pytorch/loops/fetchers.py, `_PrefetchDataFetcher.__iter__` skips its pre-fetching when
`self.length is not None` ("ignore pre-fetching, it's not necessary"), so that while step n runs the loader has
yielded batch n only. A step takes features only when their number is its batch's (`take`); otherwise (the first
step, a batch with no predecessor in this fit) it computes its own.

Where the side stream starts (train.prefetch_start): `backward` at once, so that the next forward runs beside the
whole backward; `gradients` at the event `mark_gradient` records on the compute stream when the step's first
gradient is complete (the module's post-accumulate-grad hook), so that it runs beside the rest of the backward,
the reduction and the optimizer step, and no earlier. A forward that starts at once may be done before the
reduction begins, leaving nothing beside it.

Off CUDA the same path runs without streams: `after_backward` computes the features there and then.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from specdraft.config import prefetch_refusal
from specdraft.core.types import TargetFeatures

PREFETCH_KEY = "train.prefetch_features"
SEQ_KEY = "batch_seq"
"""The key of a training batch's sequence number (an int) while prefetching may run; the step removes it."""


@dataclass
class PrefetchNeeds:
    """What train.prefetch_features needs of a run, each false with the reason it is not met."""

    cuda: bool
    features_prefetchable: bool
    eager_step: bool = True
    """The step is not replayed from a CUDA graph (train.cuda_graphs)."""

    def unmet(self, setting: str) -> List[str]:
        """The unmet needs for `setting` (PREFETCH_NEEDS keys): true also runs on a CPU (synchronously), auto on
        CUDA only."""
        checks = [(self.cuda or setting == "true", "cuda"), (self.features_prefetchable, "online"),
                  (self.eager_step, "eager")]
        return [need for met, need in checks if not met]


def prefetch_enabled(setting: str, needs: PrefetchNeeds) -> bool:
    """train.prefetch_features (auto, true, false) resolved: auto prefetches wherever `needs` are all met; true
    is an error naming the first unmet one."""
    if setting == "false":
        return False
    unmet = needs.unmet(setting)
    if unmet and setting == "true":
        raise prefetch_refusal(unmet[0])
    return not unmet


def pop_seq(batch) -> Optional[int]:
    """The batch's sequence number, removed from it (no loss, graph or count sees it); None if it has none."""
    return batch.pop(SEQ_KEY, None) if isinstance(batch, dict) else None


def computed_tensors(features: TargetFeatures) -> List[torch.Tensor]:
    """The tensors a feature forward allocates: hidden states and the final one [B, T, H], the context's (the LM
    head is the target's own weight)."""
    final = [] if features.final_hidden is None else [features.final_hidden]
    return [*features.hidden_states.values(), *final, *features.context.values()]


class FeaturePrefetch:
    """The features of the batch after the current one, for a feature source `features` (batch -> TargetFeatures,
    its batch on `device`). The training loader's batches pass through `track`; the module calls `after_backward`
    with its step's number and `take` at the next step."""

    def __init__(self, features: Callable[[Dict], TargetFeatures], device, start: str = "backward"):
        """start: train.prefetch_start (backward, gradients)."""
        self.features, self.device, self.start = features, torch.device(device), start
        self.gradient_marks = 0
        """Steps whose first complete gradient was marked (start=gradients)."""
        self._start_event: Optional[torch.cuda.Event] = None
        """The compute stream's event at the step's first complete gradient (start=gradients, CUDA)."""
        self._marked = False
        self.handed_out: Dict[int, Dict] = {}
        """Number -> host batch the loader has handed out whose features no step has started yet: the one read
        ahead (two where Lightning's fetcher reads one ahead as well)."""
        self.held: Optional[Tuple[int, TargetFeatures, Optional[torch.cuda.Event]]] = None
        """(batch number, its features, the side stream's event after them; None off CUDA)."""
        self.stream: Optional[torch.cuda.Stream] = None
        self.next_seq = 0
        """The next batch's number: it runs on across the loader's iterators, so that no number comes twice."""
        self.taken = 0
        """Steps whose features came from a prefetch."""

    def track(self, batches: Iterable[Dict]) -> Iterator[Dict]:
        """The loader's batches, each numbered (SEQ_KEY), read one ahead: while batch n is out, batch n + 1 is in
        `handed_out` (the last batch has none after it)."""
        self.handed_out.clear()
        iterator = iter(batches)
        ahead = self._numbered(next(iterator, None))
        while ahead is not None:
            current, ahead = ahead, self._numbered(next(iterator, None))
            self.handed_out = {n: batch for n, batch in self.handed_out.items() if n >= current[SEQ_KEY]}
            if ahead is not None:
                self.handed_out[ahead[SEQ_KEY]] = ahead
            yield current

    def _numbered(self, batch: Optional[Dict]) -> Optional[Dict]:
        if batch is None:
            return None
        self.next_seq += 1
        return {**batch, SEQ_KEY: self.next_seq - 1}

    def mark_gradient(self) -> None:
        """A gradient of the step is complete (a post-accumulate-grad hook): the first of the step, with
        start=gradients, records where the side stream may start (on CUDA: an event on the compute stream)."""
        if self.start != "gradients" or self._marked:
            return
        self._marked = True
        self.gradient_marks += 1
        if self.device.type == "cuda":
            self._start_event = torch.cuda.Event()
            self._start_event.record(torch.cuda.current_stream(self.device))

    def after_backward(self, seq: int) -> None:
        """Start the features of batch seq + 1, if the loader has handed it out: on CUDA on the side stream, with
        an event after them (the host goes on at once); elsewhere computed here. The batch moves to the device as
        Lightning moves the step's own (`move_data_to_device`: non-blocking on CUDA, from pinned memory)."""
        start_event, self._start_event, self._marked = self._start_event, None, False
        batch = self.handed_out.pop(seq + 1, None)
        if batch is None:
            return
        if self.device.type != "cuda":
            self.held = (seq + 1, self.features(move_data_to_device(batch, self.device)), None)
            return
        main = torch.cuda.current_stream(self.device)
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
            self.stream.wait_stream(main)  # the target's weights were placed by the compute stream's work
        if start_event is not None:
            self.stream.wait_event(start_event)
        with torch.cuda.stream(self.stream):
            features = self.features(move_data_to_device(batch, self.device))
            event = torch.cuda.Event()
            event.record(self.stream)
        for tensor in computed_tensors(features):
            # Allocated on the side stream, freed once the compute stream's step is done with them: without this
            # the caching allocator would hand their memory to the next prefetch while that step still reads it.
            tensor.record_stream(main)
        self.held = (seq + 1, features, event)

    def take(self, seq: Optional[int]) -> Optional[TargetFeatures]:
        """The features prefetched for batch `seq` (the current stream waits for their event first), or None
        when none were; features of another batch are dropped, never returned."""
        held, self.held = self.held, None
        if held is None or seq is None or held[0] != seq:
            return None
        _, features, event = held
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
        self.taken += 1
        return features
