"""One DeepSpeed ZeRO-2 rank on the CPU (gloo, bf16), for tests/test_deepspeed_step.py: a small model trained 3
steps with gradient clipping under Lightning's DeepSpeed configuration, once with specdraft's step settings
(specdraft.train.deepspeed_step), once with its single-rank settings too, and once with DeepSpeed's own (the
overflow check on, clipping as DeepSpeed does it). Prints one JSON line: per variant, each step's host reads and
uploads from DeepSpeed's code and device syncs (tests/host_reads.py says what each counts), the ops that compute
(no views) in each engine.step, and the weights after the last step.

    RANK=0 WORLD_SIZE=1 MASTER_PORT=p python -m tests.deepspeed_step_run
"""
import json
import os

import torch

from torch.utils._python_dispatch import TorchDispatchMode

from tests.host_reads import HostReads

CLIP = 0.05


def _count_syncs() -> list:
    """The accelerator's synchronize() calls, appended to the returned list. The CPU accelerator resolves data
    dependencies itself (DeepSpeed skips its syncs there): made to answer as a GPU's does."""
    from deepspeed.accelerator import get_accelerator

    syncs, accelerator = [], type(get_accelerator())
    accelerator.resolves_data_dependency = lambda self: False
    accelerator.synchronize = lambda self, device_index=None: syncs.append(1)
    return syncs


class ComputeOps(TorchDispatchMode):
    """Counts the ops that launch work on a GPU: not views, detaches nor CPU scalars."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func not in (torch.ops.aten.detach.default, torch.ops.aten.scalar_tensor.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _config(ours: bool, single_rank: bool = False) -> dict:
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from specdraft.train.deepspeed_step import merge_config, single_rank_config, step_config

    config = DeepSpeedStrategy(stage=2, reduce_bucket_size=5000).config  # buckets small enough to fill
    config.update({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": CLIP})
    merge_config(config, step_config(2, "bf16-mixed") if ours else {"bf16": {"enabled": True}})
    config["zero_optimization"]["overlap_comm"] = False  # DeepSpeed's streams do not exist on the CPU
    return merge_config(config, single_rank_config(2, 1)) if single_rank else config


def _run(ours: bool, syncs: list, single_rank: bool = False) -> dict:
    import deepspeed

    from specdraft.train.deepspeed_step import zero_step_on_device

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, zero_optimizer, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                      config=_config(ours, single_rank),
                                                      model_parameters=model.parameters())
    replaced = zero_step_on_device(zero_optimizer) if ours else False
    inputs = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    reads_each, uploads_each, syncs_each, step_ops = [], [], [], []
    for _ in range(3):
        reads = HostReads(only_from=("deepspeed/",), unless_from=("torch/optim/",))  # AdamW's step: a CPU count
        syncs.clear()
        with reads:
            loss = engine(inputs).float().pow(2).mean()
            engine.backward(loss)
            with ComputeOps() as ops:
                engine.step()
        step_ops.append(ops.count)
        reads_each.append(reads.count)
        uploads_each.append(reads.uploads)
        syncs_each.append(len(syncs))
    weights = [p.detach().float().flatten().tolist() for p in engine.module.parameters()]
    return {"reads": reads_each, "uploads": uploads_each, "syncs": syncs_each, "step_ops": step_ops,
            "replaced": replaced,
            "weights": weights, "last_grad_norm": float(zero_optimizer._global_grad_norm)}


def main() -> None:
    import deepspeed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build: plain gloo is enough
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    syncs = _count_syncs()
    theirs = _run(False, syncs)  # first: ours replaces a function of DeepSpeed's module for the whole process
    print(json.dumps({"ours": _run(True, syncs), "deepspeed": theirs, "single_rank": _run(True, syncs, True)}))


if __name__ == "__main__":
    main()
