"""One rank of a tiny DeepSpeed ZeRO run on the CPU (gloo), for tests/test_resharding.py.

    RANK=r WORLD_SIZE=n MASTER_PORT=p python -m tests.zero_run save|step|step_universal|strategy STAGE CKPT OUT

save: 3 AdamW steps, then save CKPT (tag `checkpoint`, as Lightning does). step: load CKPT, take one more step
on a fixed global batch (this rank's slice of it), write the gathered weights to OUT (rank 0).
step_universal: the same, loading CKPT's universal copy (`checkpoint.load_universal`), as
ReshardingDeepSpeedStrategy does (8-bit moments quantized again after the load).
ZERO_RUN_OPTIMIZER=adamw8bit_fused: specdraft's AdamW8bitFused (a client optimizer, as Lightning passes it;
tensors from 64 elements quantized) instead of DeepSpeed's AdamW.
strategy: the engine built by ReshardingDeepSpeedStrategy (for tests/test_deepspeed_step.py), CKPT the recipe's
zero_optimization.reduce_scatter (true, false, or - for none); OUT (rank 0) the engine's and its ZeRO optimizer's
reduce_scatter as JSON.
"""
import json
import os
import sys

import torch

GLOBAL_BATCH = 4


def _engine(stage: int, world: int, universal: bool):
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build: plain gloo is enough
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    config = {"train_micro_batch_size_per_gpu": GLOBAL_BATCH // world, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True}
    optimizer = None
    if os.environ.get("ZERO_RUN_OPTIMIZER") == "adamw8bit_fused":
        from specdraft.kernels.adamw8bit import AdamW8bitFused

        optimizer = AdamW8bitFused(model.parameters(), lr=1e-2, weight_decay=0.0, min_quantized_numel=64)
    else:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}
    if universal:
        config["checkpoint"] = {"load_universal": True}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters(),
                                      optimizer=optimizer)
    return engine


def _step(engine, batch: torch.Tensor, rank: int, world: int):
    rows = batch[rank * GLOBAL_BATCH // world:(rank + 1) * GLOBAL_BATCH // world]  # [B / world, 8]
    loss = engine(rows).pow(2).mean()
    engine.backward(loss)
    engine.step()


def _full_weights(engine) -> dict:
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        return {name: value.detach().clone() for name, value in engine.module.state_dict().items()}


def _strategy_engine(stage: int, world: int, recipe_value: str):
    """The engine of ReshardingDeepSpeedStrategy._setup_model_and_optimizer, as the trainer configures the
    strategy when the recipe sets reduce_scatter to `recipe_value` ("-": the recipe leaves it alone)."""
    import deepspeed
    from lightning.pytorch.plugins.environments import TorchElasticEnvironment

    from specdraft.train.deepspeed_step import merge_config
    from specdraft.train.resharding import ReshardingDeepSpeedStrategy

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    devices = [torch.device("cpu", rank) for rank in range(world)]  # DeepSpeed wants the root device's index
    strategy = ReshardingDeepSpeedStrategy(stage=stage, cluster_environment=TorchElasticEnvironment(),
                                           parallel_devices=devices,
                                           single_rank_zero=recipe_value == "-")
    own = {} if recipe_value == "-" else {"reduce_scatter": recipe_value == "true"}
    merge_config(strategy.config, {"train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
                                   "zero_optimization": {"overlap_comm": False, **own}})  # no CPU streams
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    return strategy._setup_model_and_optimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-2))


def report_reduce_scatter(stage: int, world: int, recipe_value: str, out: str) -> None:
    """What the engine was built with, read from DeepSpeed's own config and optimizer: not from ours."""
    engine, zero_optimizer = _strategy_engine(stage, world, recipe_value)
    if int(os.environ["RANK"]) == 0:
        with open(out, "w") as file:
            json.dump({"engine": engine.zero_reduce_scatter(), "optimizer": zero_optimizer.reduce_scatter}, file)


def main(mode: str, stage: int, checkpoint: str, out: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["LOCAL_RANK"] = str(rank)
    if mode == "strategy":
        return report_reduce_scatter(stage, world, checkpoint, out)
    engine = _engine(stage, world, universal=mode == "step_universal")
    batches = torch.randn(4, GLOBAL_BATCH, 8, generator=torch.Generator().manual_seed(1))  # [steps, B, 8]
    if mode == "save":
        for batch in batches[:3]:
            _step(engine, batch, rank, world)
        engine.save_checkpoint(checkpoint, tag="checkpoint")
        return
    engine.load_checkpoint(checkpoint)
    if mode == "step_universal":
        from specdraft.train.resharding import requantize_after_load

        converted = requantize_after_load(engine.optimizer)  # as ReshardingDeepSpeedStrategy.load_checkpoint does
        if os.environ.get("ZERO_RUN_OPTIMIZER") == "adamw8bit_fused":
            states = engine.optimizer.optimizer.state.values()
            assert converted and all("exp_avg" not in state for state in states), "float32 moments after the load"
    _step(engine, batches[3], rank, world)
    weights = _full_weights(engine)
    if rank == 0:
        torch.save(weights, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    sys.stdout.flush()
    sys.stderr.flush()
    # The work is done and written. Interpreter teardown with ZeRO's threads and gloo still alive sometimes
    # aborted ("terminate called without an active exception", exit -6) and failed the test: skip it.
    os._exit(0)
