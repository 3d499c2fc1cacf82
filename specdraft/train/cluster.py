"""Which launcher started this training process, and the node layout Lightning gets from it.

Three ways to start ranks: Lightning itself (one node: `specdraft train` starts train.devices processes), torchrun
(`--nnodes N --nproc-per-node G` on every node, rendezvous at one address) and srun (one task per GPU, SLURM's
node list; `specdraft slurm train`). Under torchrun or srun the launcher has fixed how many processes run on each
node and on how many nodes; the recipe's train.devices and train.num_nodes must say the same, and
train.devices=auto takes the launcher's count per node. torchrun inside a SLURM allocation (an srun task per node,
each starting torchrun) is torchrun's layout, not SLURM's: its RANK and WORLD_SIZE are the ranks'.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import List, Optional, Union

from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

from specdraft.config import TrainConfig
from specdraft.core.errors import SpecdraftError


@dataclass(frozen=True)
class LaunchedLayout:
    """What a launcher started: `per_node` processes on each of `nodes` nodes (None where it does not say)."""
    launcher: str
    """torchrun or srun."""
    per_node: Optional[int]
    nodes: Optional[int]
    source: str
    """The variables the counts come from, for messages."""


def launched_layout() -> Optional[LaunchedLayout]:
    """torchrun's layout (LOCAL_WORLD_SIZE processes on each of WORLD_SIZE / LOCAL_WORLD_SIZE nodes), srun's
    (SLURM_NTASKS_PER_NODE, SLURM_NNODES), or None when Lightning starts the ranks itself."""
    if TorchElasticEnvironment.detect():
        per_node, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
        return LaunchedLayout("torchrun", per_node, world // per_node,
                              f"LOCAL_WORLD_SIZE={per_node}, WORLD_SIZE={world}")
    if SLURMEnvironment.detect():
        per_node, nodes = (os.environ.get(name) for name in ("SLURM_NTASKS_PER_NODE", "SLURM_NNODES"))
        return LaunchedLayout("srun", int(per_node) if per_node and per_node.isdigit() else None,
                              int(nodes) if nodes and nodes.isdigit() else None,
                              f"SLURM_NTASKS_PER_NODE={per_node}, SLURM_NNODES={nodes}")
    return None


def cluster_plugins() -> List[SLURMEnvironment]:
    """Under srun (and not torchrun): Lightning's SLURM environment with auto-requeue. On SIGUSR1 (sbatch
    --signal) it saves hpc_ckpt_N.ckpt and runs `scontrol requeue`; the requeued job resumes with
    train.resume=auto. Elsewhere Lightning picks the environment itself (torchrun's first)."""
    layout = launched_layout()
    if layout is not None and layout.launcher == "srun":
        return [SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)]
    return []


def node_layout(cfg: TrainConfig) -> tuple:
    """-> (devices, num_nodes) for Lightning's Trainer: the recipe's, train.devices=auto resolved to the
    launcher's processes per node; a recipe that disagrees with the launcher is a one-line error naming both."""
    devices: Union[int, str] = int(cfg.devices) if cfg.devices.isdigit() else cfg.devices
    layout = launched_layout()
    if layout is None:
        return devices, cfg.num_nodes
    if devices == "auto" and layout.per_node is not None:
        devices = layout.per_node
    pairs = (("devices", devices, layout.per_node), ("num_nodes", cfg.num_nodes, layout.nodes))
    wrong = [f"train.{key}={value} (the launcher's: {launched})" for key, value, launched in pairs
             if isinstance(value, int) and launched is not None and value != launched]
    if wrong:
        fix = " ".join(f"train.{key}={launched}" for key, _, launched in reversed(pairs) if launched is not None)
        raise SpecdraftError(f"{layout.launcher} started the ranks with {layout.source}, but the recipe says "
                             f"{', '.join(wrong)}: pass {fix}")
    return devices, cfg.num_nodes
