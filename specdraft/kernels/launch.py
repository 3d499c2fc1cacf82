"""Launch-shape helpers shared by the Triton launchers (plain Python: no triton import, no device sync)."""
import functools

import torch


def next_power_of_2(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def target_programs(device: torch.device) -> int:
    """About two programs per streaming multiprocessor: enough to fill a GPU. A small fixed number on the CPU
    (the interpreter), where more programs only cost time."""
    if device.type != "cuda":
        return 8
    return 2 * _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


def split_block(rows: int, cols: int, device: torch.device, smallest: int, largest: int) -> int:
    """Power-of-two chunk width for a split-column reduction over [rows, cols]: about `target_programs` chunks
    in all, each between `smallest` and `largest` wide (never wider than the columns need)."""
    wanted = next_power_of_2(-(-rows * cols // target_programs(device)))
    return min(max(wanted, smallest), largest, next_power_of_2(cols))
