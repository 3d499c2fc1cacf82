"""ZeRO-3 with whole weights: the engine's weights kept whole on every GPU, the rest of ZeRO-3 as it is.

ZeRO-3 partitions three things across the ranks: the optimizer state, the gradients and the weights. The first two
are what it saves most of (an EAGLE-3 draft at Llama-3.1-8B shapes: 425M weights, 12 bytes each of float32 master
copy and AdamW moments, 5.1 GB, 1.3 GB per GPU at 4). Its partitioned weights cost a step three things:
  - every module call runs DeepSpeed's hooks on the host (fetch, trace, release, and autograd Functions around each
    tensor in and out for the backward): a forward of EAGLE-3's 7 TTT unrolls (23 module calls) makes 14,926
    Python calls against ZeRO-2's 1,143 (`python -m tools.bench.scale zero3-host`; the count is the same at any
    width), and a host-bound forward follows the host's pace;
  - the forward all-gathers the weights on a side stream, and the host waits on the gather's events (DeepSpeed keeps
    at most two in flight), that is on a collective, which ends when the slowest rank's host has reached it: the
    host loses the lead it had over the GPU in the middle of the forward;
  - every linear goes through DeepSpeed's `memory_efficient_linear`, a Python autograd Function.
On one GPU the gather is a no-op; on four it made ZeRO-3's forward 13-26 ms slower than on one (docs/benchmarks.md).

`train.zero3_persist` keeps the engine's weights whole instead (DeepSpeed's persistent parameters: a
`stage3_param_persistence_threshold` above every weight's size). The optimizer state and gradients stay
partitioned (gradients reduce-scattered in the backward, each rank steps its share of the float32 master weights),
and once each optimizer step the updated bf16 weights are all-gathered into the whole copies, as ZeRO-1/2 do.
With every weight whole, the module hooks have nothing to gather or release: `drop_module_hooks` removes them and
puts PyTorch's linear back: the forward is ZeRO-2's but for the weights' attribute getters (1,559 Python calls).

Memory per GPU (N ranks, W bytes of weights in the training dtype): W whole plus W/N partition, against W/N when
partitioned. At the step's peak (the backward) it changes nothing at this size: ZeRO-3 holds the gathered weights
whole from their first use in the forward to the end of the backward as long as they fit its max_live_parameters
(1e9). EAGLE-3 at Llama-3.1-8B shapes: W = 0.85 GB (0.6% of an H200), 0.64 GB more at 4 GPUs between steps.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

log = logging.getLogger(__name__)

PERSIST_MEMORY_FRACTION = 1 / 16
"""train.zero3_persist=auto keeps the engine's weights whole when they take at most this share of a GPU's memory
(an 80 GB card: 5 GB, an EAGLE-3 draft at Llama-3.1-70B shapes takes 2.8 GB)."""
PERSISTENCE_KEY = "stage3_param_persistence_threshold"


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of `module`'s weights whole, in their dtype (ZeRO-3 partitioned ones counted at their full size)."""
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in module.parameters())


def persist_weights(setting: str, module: torch.nn.Module, device_memory: int) -> bool:
    """train.zero3_persist resolved for the engine's `module` (the draft, and a sharded target if there is one) on a
    GPU of `device_memory` bytes: true, false, or (auto) whether its weights take at most PERSIST_MEMORY_FRACTION
    of that memory."""
    if setting != "auto":
        return setting == "true"
    weights = weight_bytes(module)
    persist = weights <= PERSIST_MEMORY_FRACTION * device_memory
    log.info("train.zero3_persist=auto: the engine's weights take %.2f GiB: %s", weights / 2 ** 30,
             "whole on every GPU" if persist else "partitioned (DeepSpeed's default)")
    return persist


def persistence_config(module: torch.nn.Module) -> dict:
    """The zero_optimization entry that makes every weight of `module` persistent (whole on every rank)."""
    largest = max((getattr(p, "ds_numel", p.numel()) for p in module.parameters()), default=0)
    return {PERSISTENCE_KEY: largest}


def drop_module_hooks(zero_optimizer, module: torch.nn.Module) -> bool:
    """When every weight of the engine's `module` is persistent (ZeRO-3 never partitions them during a step): the
    weights gathered now, ZeRO-3's module hooks removed (they would only trace, and wrap every tensor in and out of
    each module call) and PyTorch's linear put back in place of DeepSpeed's `memory_efficient_linear` (it exists so
    that gathered weights can be released between the forward and the backward) -> whether it did so.

    The weights stay whole from then on: each optimizer step partitions them and all-gathers the updated ones
    (`_post_step`), and checkpoint saves and loads do the same; `specdraft.layers.zero.gathered` leaves weights
    whole that were. Nothing changes for another optimizer or a module with any partitioned weight."""
    offload = getattr(zero_optimizer, "parameter_offload", None)
    params = list(module.parameters())
    if offload is None or not params or not all(getattr(p, "ds_persist", False) for p in params):
        return False
    persistent = offload.persistent_parameters
    persistent[0].all_gather(persistent)  # no hook will gather them
    offload.destroy()  # the module hooks, and the start-of-forward hook that resets the trace
    torch.nn.functional.linear = torch._C._nn.linear
    return True


def user_threshold(deepspeed_entries: dict) -> Optional[int]:
    """A persistence threshold the recipe's train.deepspeed sets itself (it has the last word), else None."""
    return (deepspeed_entries.get("zero_optimization") or {}).get(PERSISTENCE_KEY)
