"""DeepSpeed's share of a training step, without the host syncs DeepSpeed's defaults add to it.

A host sync (`.item()`, `torch.cuda.synchronize()`) makes the host wait until the device has run every queued
kernel; the device then idles through whatever host work comes next (the optimizer step's launches, Lightning's
bookkeeping, the next batch) until the next step's first long kernels are queued. tools/bench/train.py's
harness step has none. DeepSpeed ZeRO-1/2 (0.19) with Lightning's configuration has about seven a step for an
8B target's draft:

  - bf16.check_grad_overflow (on by default since 0.17): every step reads an overflow flag back
    (`has_overflow`) and checks the global norm on the host (`is_invalid_grad_norm`). bf16 scales no loss:
    an overflow check only skips steps, which torch's AdamW and the other strategies do not do either.
  - zero_optimization.overlap_comm (Lightning's default: on): every bucket's reduction and the end of the
    backward synchronize the whole device before the reduction stream runs: four syncs a step for the 425M
    parameters of that draft at Lightning's 2e8-element buckets (three reductions, then the end). Off, the
    reductions run on the compute stream in its order (nothing to overlap on one GPU; on several, the
    reduce-scatter of a bucket waits for the backward instead of the host waiting for the device), and one
    bucket buffer is allocated instead of two.
  - gradient clipping: `unscale_and_clip_grads` reads the norm back (`is_invalid_grad_norm`) whatever the
    configuration; `clip_on_device` does the same arithmetic on the device (an invalid norm still zeroes the
    step's gradients, as DeepSpeed's does).
  - the gradient norm itself (`get_grad_norm_direct`, whatever the configuration): its non-finite norm is masked
    to -1 (DeepSpeed's invalid-norm sentinel) by `mask_nan_or_inf_with_val_inplace`, which builds the -1 as a
    tensor from the host (`torch.tensor(-1.0, device=...)`: a blocking copy, the host waits for the device) and
    fills with it (`masked_fill_` with a tensor value: CUDA's kernel reads it back with `.item()`), two host
    syncs a step (seen on an H200: the `cudaStreamSynchronize` 2 and `Memcpy DtoH` 1 of every profiled step).
    `mask_norm_on_device` makes it the same fill from a host number.

tests/test_deepspeed_step.py counts the host reads, uploads and syncs of a ZeRO-2 step on the CPU (gloo).
"""
from __future__ import annotations

from typing import Optional

import torch

NO_STEP_TIMERS = {"timers": {"throughput": {"enabled": False, "synchronized": False}},
                  "steps_per_print": 2 ** 31 - 1, "wall_clock_breakdown": False}
"""DeepSpeed's throughput timer synchronizes the device at every forward and step by default (two host stalls a
step) and prints every 10 steps: the trainer logs its own rates (logs/step_times.csv)."""
ZERO3_PREFETCH_ELEMENTS = 500_000_000
"""ZeRO-3 prefetch bucket (elements): about two Llama-3.1-8B decoder layers, so that the all-gather of the next
layer overlaps the current one's compute (DeepSpeed's default, 5e7, is a quarter of one layer)."""


def step_config(stage: int, precision: str) -> dict:
    """specdraft's DeepSpeed configuration entries for ZeRO `stage` under the Lightning `precision` (resolved),
    merged over Lightning's before train.deepspeed is."""
    config = dict(NO_STEP_TIMERS)
    if precision.startswith("bf16"):  # set here, Lightning adds its own {"enabled": true} only when absent
        config["bf16"] = {"enabled": True, "check_grad_overflow": False}
    if stage == 3:  # gather the next layers of a partitioned target while this one runs
        config["zero_optimization"] = {"stage3_prefetch_bucket_size": ZERO3_PREFETCH_ELEMENTS}
    else:
        config["zero_optimization"] = {"overlap_comm": False}
    return config


SINGLE_RANK_ZERO = {"zero_optimization": {"reduce_scatter": False}}
"""ZeRO-2 on one rank: nothing to reduce, and DeepSpeed's default reduce-scatter still walks the bucket's
parameters in Python every step to cut it into per-rank slices, reduces each, and divides the whole bucket by the
world size (1: a read and a write of every gradient on the device). Off, the bucket is all-reduced whole, once,
with no division (DeepSpeed's post-scaling by world size / predivide factor is 1). The same gradients and
weights; the reduction epilogue's host time a step fell from 1.4 to 1.05 ms on the CPU (tools/host_step.py)."""


def single_rank_config(stage: int, world_size: int) -> dict:
    """SINGLE_RANK_ZERO for a ZeRO-2 run of one rank, else nothing (on several ranks reduce-scatter is what
    sends each rank only its partition)."""
    return SINGLE_RANK_ZERO if stage == 2 and world_size == 1 else {}


def sets_reduce_scatter(deepspeed_entries: dict) -> bool:
    """Whether the recipe's train.deepspeed sets zero_optimization.reduce_scatter itself (it has the last word)."""
    return "reduce_scatter" in (deepspeed_entries.get("zero_optimization") or {})


def merge_config(config: dict, entries: dict) -> dict:
    """`entries` (train.deepspeed) merged into the DeepSpeed `config` in place, nested dicts key by key."""
    for key, value in entries.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            merge_config(config[key], value)
        else:
            config[key] = value
    return config


def clip_on_device(zero_optimizer) -> bool:
    """A ZeRO-1/2 optimizer's `unscale_and_clip_grads` replaced (on this instance) by the same arithmetic without
    reading the norm back to the host -> whether it was replaced (not for other optimizers, ZeRO-3's included,
    nor a DeepSpeed without that method)."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if not isinstance(zero_optimizer, DeepSpeedZeroOptimizer) or \
            not callable(getattr(zero_optimizer, "unscale_and_clip_grads", None)):
        return False

    def unscale_and_clip_grads(grad_groups_flat, total_norm):
        scale = clip_scale(total_norm, zero_optimizer.clip_grad, zero_optimizer.loss_scale)
        if scale is None:
            return
        for grad in grad_groups_flat:
            for part in grad if isinstance(grad, list) else [grad]:
                part.data.mul_(scale)

    zero_optimizer.unscale_and_clip_grads = unscale_and_clip_grads
    return True


def zero_step_on_device(zero_optimizer) -> bool:
    """A ZeRO-1/2 optimizer's step without host syncs: `clip_on_device` on it and `mask_norm_on_device` ->
    whether both took (not for other optimizers, ZeRO-3's included)."""
    return clip_on_device(zero_optimizer) and mask_norm_on_device()


def mask_norm_on_device() -> bool:
    """DeepSpeed's ZeRO-1/2 module masks a gradient norm with `mask_invalid_norm` instead of its own
    `mask_nan_or_inf_with_val_inplace` (the same values, no host sync; idempotent) -> whether it was replaced
    (not in a DeepSpeed without that function). Process-wide: no other optimizer of that module differs."""
    from deepspeed.runtime.zero import stage_1_and_2

    if not callable(getattr(stage_1_and_2, "mask_nan_or_inf_with_val_inplace", None)):
        return False
    stage_1_and_2.mask_nan_or_inf_with_val_inplace = mask_invalid_norm
    return True


def mask_invalid_norm(norm: torch.Tensor, device=None, val: float = -1.0) -> None:
    """`norm`'s non-finite entries set to `val` in place, filled from a host number: neither a tensor built on
    the host nor a value read back. `device` is DeepSpeed's argument (where it built its fill value), unused."""
    norm.masked_fill_(~torch.isfinite(norm), val)


def clip_scale(total_norm, clip_grad: float, loss_scale: float) -> Optional[torch.Tensor | float]:
    """What the gradients are multiplied by: 1 / loss_scale, and with clipping 1 / max(1, norm / clip_grad) too
    (norm: `total_norm` / loss_scale, a tensor on the device; a non-finite or negative one, DeepSpeed's sentinel
    for an invalid norm, clips to zero); None when there is nothing to do."""
    if clip_grad == 0.0 and loss_scale == 1.0:
        return None
    if clip_grad <= 0.0:
        return 1.0 / loss_scale
    norm = torch.as_tensor(total_norm, dtype=torch.float32)
    norm = torch.where(torch.isfinite(norm) & (norm >= 0), norm, torch.full_like(norm, float("inf")))
    clip = torch.clamp((norm / loss_scale + 1e-6) / clip_grad, min=1.0)
    return 1.0 / (clip * loss_scale)
