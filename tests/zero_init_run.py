"""One rank (gloo, CPU) that builds every method's draft twice with the same seed: plainly, and under DeepSpeed's
zero.Init as Lightning's configure_model does under deepspeed_stage_3. For tests/test_zero_init.py.

    RANK=0 WORLD_SIZE=1 MASTER_PORT=p python -m tests.zero_init_run '{"eagle3": {"ttt_steps": 3}, ...}'

Prints `differs METHOD PARAM` for each parameter whose gathered ZeRO-3 value is not the plain one, then `done`.
"""
import json
import os
import sys

import torch


def main(cases: dict) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["LOCAL_RANK"] = os.environ["RANK"]
    import deepspeed

    from specdraft.methods import get_method
    from specdraft.methods.base import DraftContext, TargetInfo
    from tests.tiny import tiny_llama_config

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build: plain gloo is enough
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    ctx = DraftContext(target=TargetInfo.from_hf_config(tiny_llama_config(), "tiny"))
    for name, settings in cases.items():
        spec = get_method(name)
        cfg = spec.config(**settings)
        torch.manual_seed(0)
        plain = spec.build(cfg, ctx)
        torch.manual_seed(0)
        with deepspeed.zero.Init(config_dict_or_path=config):  # as Lightning enters it: dtype from the config
            sharded = spec.build(cfg, ctx)
        params = dict(sharded.named_parameters())
        assert all(hasattr(p, "ds_id") for p in params.values()), name  # built partitioned
        with deepspeed.zero.GatheredParameters(list(params.values())):
            for key, value in plain.named_parameters():
                if not torch.equal(params[key].detach(), value.detach()):
                    print("differs", name, key, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
