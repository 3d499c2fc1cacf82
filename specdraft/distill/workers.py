"""Which shards a `distill-data` process owns when several run at once (GPUs, nodes, SLURM array tasks).

Shards are dealt round-robin: worker w of n owns shards w, w + n, w + 2n, ... so n workers never write the same
shard and together write all of them, whatever n is. A shard's content depends only on its index (its seed is
`distill.seed + shard index`), so shards written by any number of workers, in any order, or by an interrupted
run resumed with another n, are interchangeable.

A worker's identity comes from the recipe (`distill.num_workers`, `distill.worker_index`) or else from the
launcher's environment, as array position x task position:
  SLURM array       SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT (SLURM_ARRAY_TASK_STEP)
  torchrun, Lightning  RANK, WORLD_SIZE
  srun tasks        SLURM_PROCID, SLURM_NTASKS, only inside an srun step (SLURM_STEP_ID set): a batch script
                    run without srun sees SLURM_NTASKS of the whole allocation but is a single process
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

from specdraft.config import DistillConfig
from specdraft.core.errors import SpecdraftError

BATCH_STEP = "batch"
"""SLURM_STEP_ID of the batch script itself (srun steps are numbered)."""


@dataclass(frozen=True)
class Worker:
    index: int
    count: int
    source: str
    """Where the identity came from, for the log: recipe, environment variable names, or single."""

    def __str__(self) -> str:
        return f"worker {self.index} of {self.count} ({self.source})"


def _env_int(env: Mapping[str, str], name: str) -> Optional[int]:
    value = env.get(name, "").strip()
    return int(value) if value.lstrip("-").isdigit() else None


def array_position(env: Mapping[str, str]) -> Optional[Tuple[int, int]]:
    """(index, count) of a SLURM array task, or None outside an array."""
    task_id, first = _env_int(env, "SLURM_ARRAY_TASK_ID"), _env_int(env, "SLURM_ARRAY_TASK_MIN")
    count = _env_int(env, "SLURM_ARRAY_TASK_COUNT")
    if task_id is None or first is None or count is None:
        return None
    step = _env_int(env, "SLURM_ARRAY_TASK_STEP") or 1
    return (task_id - first) // step, count


def task_position(env: Mapping[str, str]) -> Optional[Tuple[int, int]]:
    """(rank, world size) of a process among its job's tasks, or None for a lone process."""
    rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    if rank is not None and world is not None:
        return rank, world
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", BATCH_STEP))
    rank, world = _env_int(env, "SLURM_PROCID"), _env_int(env, "SLURM_NTASKS")
    if step != BATCH_STEP and rank is not None and world is not None:
        return rank, world
    return None


def worker_from_env(env: Mapping[str, str]) -> Worker:
    """The worker a launcher made this process: array position x task position (each 0 of 1 when absent)."""
    array, task = array_position(env), task_position(env)
    sources = [name for name, found in (("SLURM array", array), ("task rank", task)) if found]
    array, task = array or (0, 1), task or (0, 1)
    return Worker(index=array[0] * task[1] + task[0], count=array[1] * task[1],
                  source=" x ".join(sources) or "single")


def resolve_worker(cfg: DistillConfig, env: Optional[Mapping[str, str]] = None) -> Worker:
    """The recipe's distill.num_workers / distill.worker_index where set, the environment's otherwise."""
    found = worker_from_env(os.environ if env is None else env)
    count = found.count if cfg.num_workers is None else cfg.num_workers
    index = found.index if cfg.worker_index is None else cfg.worker_index
    source = found.source if cfg.num_workers is None and cfg.worker_index is None else "recipe"
    if not 0 <= index < count:
        raise SpecdraftError(f"distill worker index {index} is outside [0, {count}) ({found.source} gives "
                             f"{found.index} of {found.count}); set distill.num_workers and distill.worker_index")
    return Worker(index=index, count=count, source=source)


def worker_shards(num_shards: int, worker: Worker) -> List[int]:
    """The shard indices `worker` owns: round-robin, so every worker gets a share of the short tail."""
    return list(range(worker.index, num_shards, worker.count))


def local_device_index(env: Optional[Mapping[str, str]] = None) -> int:
    """The GPU a worker should use among the visible ones: LOCAL_RANK (torchrun) or SLURM_LOCALID (srun)."""
    env = os.environ if env is None else env
    found = [_env_int(env, name) for name in ("LOCAL_RANK", "SLURM_LOCALID")]
    return next((index for index in found if index is not None), 0)
