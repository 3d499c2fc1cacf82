"""Op tables from a torch.profiler run over some training steps (tools/profile_train.py, tools/bench/train.py
--profile): the device's busy time, kernel launches, and the ops with the most device and host time per step."""
from __future__ import annotations

from typing import Dict

import torch


def _device_us(event) -> float:
    return getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)


def _is_kernel(event) -> bool:
    """A GPU kernel's own entry: not the op it ran for (which carries its time too) nor a named range."""
    return _device_us(event) > 0 and event.device_type == torch.autograd.DeviceType.CUDA \
        and not getattr(event, "is_user_annotation", False)


def op_report(profiler: torch.profiler.profile, steps: int, top: int) -> Dict:
    """-> device_busy_ms and kernel_launches_per_step (kernels alone), top_device and top_host: the `top` ops
    by self device time and by self host time, each {name, calls_per_step, device_ms, host_ms} per step."""
    events = profiler.key_averages()
    kernels = [event for event in events if _is_kernel(event)]

    def table(key) -> list:
        return [{"name": e.key, "calls_per_step": e.count / steps, "device_ms": _device_us(e) / 1e3 / steps,
                 "host_ms": e.self_cpu_time_total / 1e3 / steps} for e in sorted(events, key=key, reverse=True)[:top]]

    return {"device_busy_ms": sum(_device_us(e) for e in kernels) / 1e3 / steps,
            "kernel_launches_per_step": sum(e.count for e in kernels) / steps,
            "host_waits_per_step": host_waits(events, steps),
            "top_device": table(_device_us), "top_host": table(lambda e: e.self_cpu_time_total)}


HOST_WAITS = ("Synchronize", "Memcpy DtoH", "cudaMemcpy ")
"""Event names in which the host waits for the device: explicit synchronizations, and copies to the host
(`.item()`, `.tolist()`, a tensor in an `if`), each of which lets the device run dry before the next launch."""


def host_waits(events, steps: int) -> Dict[str, float]:
    """-> {event name: calls per step} for every event in which the host waits for the device."""
    return {e.key: e.count / steps for e in events if any(marker in e.key for marker in HOST_WAITS)}


def print_op_tables(report: Dict, prefix: str = "") -> None:
    waits = report.get("host_waits_per_step", {})
    print(f"\n{prefix}host waits for the device (per step): "
          + (", ".join(f"{name} {calls:g}" for name, calls in waits.items()) or "none"))
    for title, key in (("most device time", "top_device"), ("most host time", "top_host")):
        print(f"\n{prefix}{title} (per step)\n| op | calls | device ms | host ms |\n|---|---|---|---|")
        for op in report[key]:
            print(f"| {op['name'][:60]} | {op['calls_per_step']:.0f} | {op['device_ms']:.2f} | {op['host_ms']:.2f} |")
