"""Draft heads built under DeepSpeed's zero.Init (ZeRO-3: Lightning's configure_model runs inside one).

zero.Init partitions a module's parameters as soon as that module's own __init__ returns: a parent's __init__
then sees each child's weight as an empty tensor (its values live in `ds_tensor`, 1/N of them per rank), and
whatever it writes there is lost. A draft that re-initializes its linear layers after building them (e.g.
N(0, init_std)) must gather them whole for that, or under ZeRO-3 it keeps PyTorch's default initialization."""
from __future__ import annotations

import contextlib
from typing import Optional

from torch import nn


@contextlib.contextmanager
def gathered(params, modifier_rank: Optional[int] = 0):
    """A context in which ZeRO-3 partitioned parameters are whole (a no-op for plain ones): what rank
    `modifier_rank` writes in it is kept and shared; None gathers them read-only (every rank reads them whole).

    Parameters whole before it (ZeRO-3's persistent ones, specdraft.train.zero3) are whole after it too: DeepSpeed's
    context partitions everything it was given on exit, and with every weight persistent no module hook would
    gather them again. Read-only, they are left out; written, they are gathered again after the write."""
    params = [p for p in params if hasattr(p, "ds_id")]
    whole = [p for p in params if p.ds_status.name == "AVAILABLE"]
    if modifier_rank is None:
        params = [p for p in params if p.ds_status.name != "AVAILABLE"]
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
        yield
    if whole and modifier_rank is not None:
        whole[0].all_gather(whole)


def init_linear_normal_(module: nn.Module, std: float) -> None:
    """Every nn.Linear weight in `module` (in `module.modules()` order) drawn from N(0, std); ZeRO-3 partitions
    are gathered for it and rank 0's draw kept, so a draft built under zero.Init starts where one built plainly
    (same seed) does."""
    weights = [m.weight for m in module.modules() if isinstance(m, nn.Linear)]
    with gathered(weights):
        for weight in weights:
            nn.init.normal_(weight, std=std)


def register_external(module: nn.Module, params) -> None:
    """Under ZeRO-3 (partitioned parameters; a no-op otherwise): `module`'s forward reads `params`, weights of
    its submodules, directly (one joined matmul, say) rather than through the submodules' own forwards, which
    is when DeepSpeed gathers them. Registered, they are gathered for `module`'s forward and backward too;
    unregistered, the forward finds empty partitions."""
    params = [p for p in params if hasattr(p, "ds_id")]
    if not params:
        return
    import deepspeed

    for param in params:
        deepspeed.zero.register_external_parameter(module, param)
