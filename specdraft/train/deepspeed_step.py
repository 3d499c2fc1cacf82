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
    `mask_norm_on_device` makes it the same fill from a host number, one kernel.
  - the gradient norm's device work and launches: `get_grad_norm_direct` writes an fp64 copy of each parameter's
    gradient and reads it back for its norm (for the 425M gradients of that draft, 3.4 GB written and read a
    step), a cast and a norm launched per tensor; `foreach_grad_norm` takes the same per-tensor norms,
    accumulated in fp64, with one `torch._foreach_norm` that reads the bf16 gradients once, and adds them up as
    DeepSpeed does. Its mask (`mask_invalid_norm`), the groups' combination (`combine_norms_on_device`) and the
    clip's scale (`clip_scale`) give the same values in about 20 fewer kernels (CUDA's `isfinite` is four).

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
    """A ZeRO-1/2 optimizer's step without host syncs and with fewer launches: `clip_on_device` on it,
    `mask_norm_on_device`, `foreach_grad_norm` and `combine_norms_on_device` -> whether all took (not for other
    optimizers, ZeRO-3's included)."""
    return clip_on_device(zero_optimizer) and mask_norm_on_device() and foreach_grad_norm(zero_optimizer) \
        and combine_norms_on_device()


def foreach_grad_norm(zero_optimizer) -> bool:
    """A ZeRO-1/2 optimizer's `get_grad_norm_direct` (the L2 norm of its partition's gradients) replaced (on this
    instance) by the same sum: each counted gradient's norm in DeepSpeed's norm dtype (fp64 where the device has
    it), squared, summed and cast to float32, all-reduced over the data- and model-parallel groups, its square
    root masked; the per-tensor norms from one `torch._foreach_norm` instead of an fp64 copy and a norm a tensor.
    Other norms (inf) and an empty partition go to DeepSpeed's own -> whether it was replaced."""
    from deepspeed.runtime.zero import stage_1_and_2 as zero

    if not isinstance(zero_optimizer, zero.DeepSpeedZeroOptimizer) or \
            not callable(getattr(zero_optimizer, "get_grad_norm_direct", None)):
        return False
    own = zero_optimizer.get_grad_norm_direct

    def get_grad_norm_direct(gradients, params, norm_type=2):
        grads = counted_gradients(zero_optimizer, gradients, params)
        if float(norm_type) != 2.0 or not grads:
            return own(gradients, params, norm_type)
        norms = torch._foreach_norm(grads, 2, dtype=zero.get_norm_dtype())  # one scalar a tensor
        total = torch.stack(norms).pow(2).sum().float()
        zero.dist.all_reduce(total, op=zero.dist.ReduceOp.SUM, group=zero_optimizer.dp_process_group)
        zero_optimizer._model_parallel_all_reduce(tensor=total, op=zero.dist.ReduceOp.SUM)
        total = total.pow(0.5)
        zero.mask_nan_or_inf_with_val_inplace(total, device=zero_optimizer.device)
        return total

    zero_optimizer.get_grad_norm_direct = get_grad_norm_direct
    return True


def counted_gradients(zero_optimizer, gradients, params) -> list:
    """The gradients DeepSpeed's norm counts: not its alignment padding, nor a pipeline-replicated parameter's,
    and on model-parallel ranks other than 0 only the model-parallel parameters' (no one counted twice)."""
    from deepspeed.runtime.zero import stage_1_and_2 as zero

    unpadded = (grad for grad in gradients if not getattr(grad, "_zero_padding", False))
    return [grad.data for grad, param in zip(unpadded, params)
            if not (hasattr(param, zero.PIPE_REPLICATED) and param.ds_pipe_replicated)
            and (zero.is_model_parallel_parameter(param) or zero_optimizer.model_parallel_rank == 0)]


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
    the host nor a value read back, one kernel (`isfinite` alone is four on CUDA). `device` is DeepSpeed's
    argument (where it built its fill value), unused."""
    torch.nan_to_num_(norm, nan=val, posinf=val, neginf=val)


def combine_norms_on_device() -> bool:
    """DeepSpeed's ZeRO-1/2 module combines its groups' gradient norms with `combine_norms` instead of its own
    `combine_grad_norm_groups` (idempotent, process-wide like `mask_norm_on_device`) -> whether it was replaced
    (not in a DeepSpeed without that function)."""
    from deepspeed.runtime.zero import stage_1_and_2

    if not callable(getattr(stage_1_and_2, "combine_grad_norm_groups", None)):
        return False
    stage_1_and_2.combine_grad_norm_groups = combine_norms
    return True


def combine_norms(norm_groups, norm_type=2) -> torch.Tensor:
    """The L2 norm of the groups' norms (tensors or numbers), +inf when one of them is invalid (NaN, -inf or
    negative: DeepSpeed's -1 sentinel), as DeepSpeed's `combine_grad_norm_groups` gives it (a +inf norm makes
    the combined norm +inf by itself), in fewer kernels: no `isfinite`, the inf a host number."""
    norm_groups = list(norm_groups)
    device = next((norm.device for norm in norm_groups if torch.is_tensor(norm)), None)
    stacked = torch.stack([norm if torch.is_tensor(norm) else torch.tensor(norm, dtype=torch.float, device=device)
                           for norm in norm_groups])  # [groups]
    combined = torch.linalg.vector_norm(stacked, ord=norm_type)
    return torch.where((stacked >= 0).all(), combined, float("inf"))  # NaN >= 0 is False


def clip_scale(total_norm, clip_grad: float, loss_scale: float) -> Optional[torch.Tensor | float]:
    """What the gradients are multiplied by: 1 / loss_scale, and with clipping 1 / max(1, norm / clip_grad) too
    (norm: `total_norm` / loss_scale, a tensor on the device; a non-finite or negative one, DeepSpeed's sentinel
    for an invalid norm, clips to zero); None when there is nothing to do."""
    if clip_grad == 0.0 and loss_scale == 1.0:
        return None
    if clip_grad <= 0.0:
        return 1.0 / loss_scale
    norm = torch.as_tensor(total_norm, dtype=torch.float32)
    norm = torch.where(norm >= 0, norm, float("inf"))  # NaN, -inf, the -1 sentinel: inf (inf stays inf)
    unscaled = norm if loss_scale == 1.0 else norm / loss_scale  # bf16 scales no loss: no launch for exact ones
    clip = torch.clamp((unscaled + 1e-6) / clip_grad, min=1.0)
    return torch.reciprocal(clip if loss_scale == 1.0 else clip * loss_scale)
