"""One DeepSpeed rank on the CPU (gloo, no C++ build) and what compares a draft under ZeRO-3 with the same draft
built plainly: both drafts from one seed, a random batch of token ids and target features, and the module whose
forward is the training loss, as Lightning's DeepSpeed strategy calls it. For tests/zero_init_run.py and the
scaling suite's host-work part (tools/bench/scale_host.py)."""
import os

import torch


def init_gloo_rank() -> None:
    """This process as rank RANK of WORLD_SIZE (gloo, MASTER_PORT from the environment, the loopback address)."""
    import deepspeed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["LOCAL_RANK"] = os.environ["RANK"]
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build: plain gloo is enough
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)


def plain_and_sharded(name: str, settings: dict, ctx, config: dict):
    """-> (spec, cfg, the draft built plainly, the same draft (same seed) built under zero.Init as Lightning
    enters it: dtype from the config)."""
    import deepspeed

    from specdraft.methods import get_method

    spec = get_method(name)
    cfg = spec.config(**settings)
    torch.manual_seed(0)
    plain = spec.build(cfg, ctx)
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        sharded = spec.build(cfg, ctx)
    return spec, cfg, plain, sharded


def random_batch(spec, cfg, info, generator, rows: int = 2, repeat: int = 1):
    """Random token ids and target features: `rows` rows, each repeated `repeat` times (identical rows give
    every rank of a data-parallel run the same loss normalization as one process with all of them)."""
    from specdraft.core.types import DraftBatch, TargetFeatures

    def rows_of(*shape):  # [rows * repeat, *shape]
        return torch.randn(rows, *shape, generator=generator).repeat_interleave(repeat, dim=0)

    ids = torch.randint(0, info.vocab_size, (rows, 16), generator=generator).repeat_interleave(repeat, 0)  # [B, T]
    layers = sorted({0, *spec.feature_layers(cfg, info)})
    hidden = {i: rows_of(16, info.hidden_size) for i in layers}  # [B, T, H] each
    features = TargetFeatures(hidden_states=hidden, final_hidden=rows_of(16, info.hidden_size),
                              lm_head=torch.randn(info.vocab_size, info.hidden_size, generator=generator),
                              embed_tokens=torch.randn(info.vocab_size, info.hidden_size, generator=generator))
    return DraftBatch(ids, torch.ones_like(ids), torch.ones_like(ids), features)


class LossModule(torch.nn.Module):
    """The engine's module whose forward is the training loss, as Lightning's DeepSpeed strategy calls it
    (DeepSpeed starts each step's parameter trace in that forward's pre-hook)."""

    def __init__(self, spec, cfg, draft):
        super().__init__()
        self.spec, self.cfg, self.draft = spec, cfg, draft

    def forward(self, batch):
        return self.spec.loss(self.draft, batch, self.cfg).loss
