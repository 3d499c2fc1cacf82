"""`specdraft train RECIPE`: build the data, the draft and the Lightning trainer, fit, keep best/ and last/.

RUN_DIR (train.output_dir)/
  recipe.yaml                   the resolved recipe (train.output_dir must be new, empty or a run's: a directory
                                of other files is refused)
  checkpoints/last.ckpt         full training state (weights, optimizer, scheduler, step, every RNG, best score,
                                recipe) for resume, written after each validation, whole or not at all
  hpc_ckpt_N.ckpt               the same, saved by Lightning when SLURM signals a preemption (SIGUSR1)
  best/ last/                   draft.safetensors + meta.json (step, validation metrics): what export reads
  logs/                         CSV metrics (train/*, val/acc@k, val/tau_sim); step_times.csv (per-step wall times)
  features/                     data.features=hybrid: the cached target features (specdraft.data.features)
  train_summary.json            steps and tokens of the whole run (a resumed run's too), this fit's seconds and
                                tokens/s (start-up included), steady tokens/s (from the step times, warm-up left
                                out), the best validation score and what it scores (`monitor`: τ_sim for
                                drafts, a method's own metric else), this GPU's peak allocated bytes

Resuming reads checkpoints/last.ckpt with torch.load(weights_only=True) (checked before the run writes anything);
a DeepSpeed checkpoint directory only when its signed manifest says this user's runs wrote it, or with
--trust-checkpoint (specdraft/train/manifest.py). The recipe must be the one the checkpoint was trained with, but
for the keys `checkpoints.RESUME_SAFE` lists; a resumed run then continues as the uninterrupted one would have
(the same batches, RNG states, best/ and final weights).
"""
from __future__ import annotations

import logging
import signal
import time
from functools import partial
from pathlib import Path
from typing import List, Optional, Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from specdraft.config import Recipe, TrainConfig
from specdraft.recipes import recipe_to_yaml, save_recipe
from specdraft.drafts import SNAPSHOT_FILE, load_base, warm_start_draft
from specdraft.core.errors import Interrupted, SpecdraftError
from specdraft.core.io import atomic_dir, is_write_error, write_error, write_json
from specdraft.core.tensor_files import save_tensors
from specdraft.layers.zero import gathered
from specdraft.layers.compile import compile_enabled
from specdraft.methods import get_method
from specdraft.core.types import DraftContext
from specdraft.targets import load_target_info
from specdraft.train.deepspeed_step import merge_config, sets_reduce_scatter, step_config
from specdraft.train.device_reads import SigtermFlag
from specdraft.train.cluster import cluster_plugins, node_layout
from specdraft.train.data import RecordData, answer_token_counts, load_distilled, split_distilled
from specdraft.train.features import build_features
from specdraft.train.checkpoints import AtomicCheckpointIO, LastCheckpoint, check_resume_recipe, claim_run_dir
from specdraft.train.manifest import check_checkpoint_file
from specdraft.train.module import DraftModule
from specdraft.train.progress import CheckpointStep, TrainProgress, interrupted_message
from specdraft.train.resharding import ReshardingDeepSpeedStrategy, is_deepspeed_checkpoint
from specdraft.train.timing import StepTimes
from specdraft.train.zero3 import user_threshold

log = logging.getLogger(__name__)

class DraftSnapshots(Callback):
    """The resolved recipe.yaml once training starts (after a resumed checkpoint was read and found to fit: a
    refused resume leaves the run directory as it was), then after each validation last/ and (when val/tau_sim
    improves) best/ draft weights, each written atomically. Its state in a checkpoint: the best score so far and
    the recipe (what a resume is compared with)."""

    def __init__(self, run_dir: Path, recipe: Recipe, monitor: str = "val/tau_sim"):
        self.run_dir, self.recipe, self.monitor = run_dir, recipe, monitor
        self.best: Optional[float] = None

    def state_dict(self):
        return {"best": self.best, "recipe": recipe_to_yaml(self.recipe)}

    def load_state_dict(self, state):
        self.best = state.get("best")

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero:
            save_recipe(self.recipe, self.run_dir)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        score = float(trainer.callback_metrics[self.monitor])
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        meta = {"step": trainer.global_step, "method": self.recipe.method_name, "metrics": metrics}
        improved = self.best is None or score > self.best
        self.best = score if improved else self.best
        state = full_draft_state(pl_module.draft)  # a collective under ZeRO-3: every rank takes part
        if trainer.is_global_zero:
            for name in ("last", "best") if improved else ("last",):
                self._write(name, state, meta)

    def _write(self, name: str, state: dict, meta: dict):
        with atomic_dir(self.run_dir / name) as tmp:
            save_tensors(state, tmp / SNAPSHOT_FILE)  # 0644, as the run's other files
            write_json(tmp / "meta.json", meta)


def full_draft_state(draft: torch.nn.Module) -> dict:
    """The draft's whole state dict on CPU (float32 floats), gathering ZeRO-3 partitions if there are any."""
    def to_cpu(module):
        return {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype).contiguous()
                for k, v in module.state_dict().items()}

    with gathered(draft.parameters(), modifier_rank=None):
        return to_cpu(draft)


def _strategy(cfg: TrainConfig, resume_from: Optional[str], trust_checkpoint: bool = False):
    check_resume_format(cfg, resume_from)
    if not cfg.strategy.startswith("deepspeed"):
        return cfg.strategy
    if not torch.cuda.is_available():
        raise SpecdraftError(f"train.strategy={cfg.strategy} needs CUDA GPUs; on CPU use: auto, ddp")
    stage = int(cfg.strategy[-1])
    persist = "false" if user_threshold(cfg.deepspeed) is not None else cfg.zero3_persist  # the recipe's own wins
    single_rank_zero = not sets_reduce_scatter(cfg.deepspeed)  # the recipe's own reduce_scatter wins
    strategy = ReshardingDeepSpeedStrategy(stage=stage, resume_from=resume_from, trust_checkpoint=trust_checkpoint,
                                           zero3_persist=persist, single_rank_zero=single_rank_zero,
                                           exclude_frozen_parameters=True)
    # no host syncs a step (deepspeed_step.py)
    merge_config(strategy.config, step_config(stage, lightning_precision(cfg)))
    merge_config(strategy.config, cfg.deepspeed)
    return strategy


def check_resume_format(cfg: TrainConfig, resume_from: Optional[str]) -> None:
    """DeepSpeed checkpoints are directories of partitions, the others single files: no crossing over."""
    if resume_from is None or is_deepspeed_checkpoint(resume_from) == cfg.strategy.startswith("deepspeed"):
        return
    saved_by = "a DeepSpeed strategy" if is_deepspeed_checkpoint(resume_from) else "auto or ddp"
    raise SpecdraftError(f"checkpoint {resume_from} was saved by {saved_by}; train.strategy={cfg.strategy} "
                         f"cannot resume it (resume with the kind of strategy that saved it)")


def lightning_precision(cfg: TrainConfig) -> str:
    if cfg.precision != "auto":
        return cfg.precision
    return "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"


def _newest(paths: List[Path]) -> Optional[Path]:
    """The most recently written checkpoint (a file, or a DeepSpeed directory)."""
    def written(path: Path) -> float:
        return max([path.stat().st_mtime, *(p.stat().st_mtime for p in path.rglob("*") if p.is_file())])

    existing = [path for path in paths if path.exists()]
    return max(existing, key=written) if existing else None


def resume_path(cfg: TrainConfig, run_dir: Path) -> Optional[str]:
    """train.resume: None, a path, or auto: the newest of checkpoints/last.ckpt (saved every val_every_steps)
    and the hpc_ckpt_N.ckpt Lightning saves when SLURM signals a preemption."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        newest = _newest([run_dir / "checkpoints" / "last.ckpt", *run_dir.glob("hpc_ckpt_*.ckpt")])
        return str(newest) if newest else None
    if not Path(cfg.resume).exists():
        raise SpecdraftError(f"train.resume checkpoint not found: {cfg.resume}")
    return cfg.resume


def trainer_plugins() -> list:
    """Checkpoint files written atomically (AtomicCheckpointIO); under SLURM (srun, not torchrun) Lightning's SLURM
    environment with auto-requeue (specdraft.train.cluster)."""
    return [AtomicCheckpointIO(), *cluster_plugins()]


def build_trainer(cfg: TrainConfig, run_dir: Path, recipe: Recipe, resume_from: Optional[str] = None,
                  extra_callbacks: Sequence[Callback] = (), monitor: str = "tau_sim",
                  trust_checkpoint: bool = False) -> L.Trainer:
    devices, num_nodes = node_layout(cfg)  # checked against torchrun's or srun's layout
    callbacks = [LastCheckpoint(run_dir / "checkpoints"), DraftSnapshots(run_dir, recipe, f"val/{monitor}"),
                 ResumeReport(), FinishLastStep(cfg), StepTimes(run_dir / "logs", cfg.log_every_steps),
                 CheckpointStep(),
                 TrainProgress(cfg, ("train/loss", "train/tokens_per_s", f"val/{monitor}")), *extra_callbacks]
    trainer = L.Trainer(
        accelerator="auto", devices=devices, num_nodes=num_nodes,
        strategy=_strategy(cfg, resume_from, trust_checkpoint),
        precision=lightning_precision(cfg), max_steps=cfg.max_steps, max_epochs=-1, plugins=trainer_plugins(),
        accumulate_grad_batches=cfg.accumulate_grad_batches, gradient_clip_val=cfg.grad_clip or None,
        val_check_interval=cfg.val_every_steps * cfg.accumulate_grad_batches, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, log_every_n_steps=cfg.log_every_steps, use_distributed_sampler=False,
        callbacks=callbacks, logger=CSVLogger(run_dir, name="logs"), default_root_dir=run_dir,
        enable_model_summary=False, enable_progress_bar=False,  # TrainProgress draws the bar
    )
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = SigtermFlag(trainer)  # no host sync a step (ranks > 1)
    return trainer


def peak_memory(device: torch.device) -> Optional[int]:
    """The most bytes this rank's GPU allocator held at once in this process (the frozen target included); None
    off CUDA."""
    return torch.cuda.max_memory_allocated(device) if torch.device(device).type == "cuda" else None


def shard_target(recipe: Recipe, device: torch.device) -> bool:
    """train.shard_target resolved: true, false, or (auto) whether the target's weights in its training dtype
    would take more than half of this GPU's memory under deepspeed_stage_3 with online features."""
    cfg = recipe.train
    if cfg.shard_target != "auto":
        return cfg.shard_target == "true"
    shardable = cfg.strategy == "deepspeed_stage_3" and recipe.data.features == "online" \
        and recipe.target.quantization == "none" and torch.device(device).type == "cuda"
    if not shardable:
        return False
    from specdraft.targets.load import estimated_weight_bytes, load_target_info
    from specdraft.train.features import feature_dtype

    weights = estimated_weight_bytes(load_target_info(recipe.target), feature_dtype(recipe.target, device))
    shard = weights > torch.cuda.get_device_properties(device).total_memory / 2
    log.info("train.shard_target=auto: the target's weights take about %.1f GiB: %s", weights / 2 ** 30,
             "partitioned across the ranks (ZeRO-3)" if shard else "a whole copy on each GPU")
    return shard


class FinishLastStep(Callback):
    """When max_steps is not a multiple of val_every_steps: validation (so the best/ and last/ snapshots, and
    LastCheckpoint's checkpoints/last.ckpt after it) at the last step too, not only at the last multiple. The
    validation runs inside the fit loop, which validates before stopping when asked to stop: a separate
    `trainer.validate` after fit set the model up again, and under ZeRO-3 found buffers and weights off the rank's
    GPU (seen on H100s)."""

    def __init__(self, cfg: TrainConfig):
        self.max_steps, self.every = cfg.max_steps, cfg.val_every_steps

    def _off_schedule(self, trainer) -> bool:
        return trainer.global_step >= self.max_steps and trainer.global_step % self.every != 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._off_schedule(trainer):
            trainer.should_stop = True


class ResumeReport(Callback):
    """Logs once what a resumed run restored, and remembers the world size each checkpoint was saved on."""

    def __init__(self):
        self.world_size: Optional[int] = None
        self.saved_world_size: Optional[int] = None

    def state_dict(self):
        return {"world_size": self.world_size}

    def load_state_dict(self, state):
        self.saved_world_size = state.get("world_size")

    def setup(self, trainer, pl_module, stage):
        self.world_size = trainer.world_size

    def on_train_start(self, trainer, pl_module):
        path = trainer.ckpt_path
        if path is None or not trainer.is_global_zero:
            return
        saved = self.saved_world_size or "?"
        resharded = getattr(trainer.strategy, "restored_from", None)
        if resharded is not None:
            how = (f"ZeRO-{resharded.stage} partitions of world size {resharded.world_size} re-partitioned for "
                   f"world size {trainer.world_size} through a DeepSpeed universal checkpoint")
        elif is_deepspeed_checkpoint(path):
            how = f"ZeRO partitions loaded as saved, world size {trainer.world_size}"
        else:
            how = f"full state, saved at world size {saved}, loaded at world size {trainer.world_size}"
        log.info("resumed %s at step %d: draft weights, AdamW state (%s), LR schedule, data position (global "
                 "sample %d) and RNG restored", path, trainer.global_step, how, trainer.datamodule.global_position())


def fit(trainer: L.Trainer, module: DraftModule, data, resume_from: Optional[str]) -> None:
    """trainer.fit; on Ctrl-C, after Lightning's teardown (which ends in sys.exit(1), SIGINT left ignored),
    Interrupted with what the run kept and SIGINT's handler put back; a disk that refuses a write, one line."""
    handler = signal.getsignal(signal.SIGINT)
    run_dir = Path(trainer.default_root_dir)
    try:
        trainer.fit(module, datamodule=data, ckpt_path=resume_from, weights_only=True)
    except OSError as err:  # a full or read-only disk under a writer of Lightning's (its CSV logs): one line
        if not is_write_error(err, run_dir / "logs"):
            raise
        raise write_error(err.filename or run_dir, err) from None
    except SystemExit:
        if not trainer.interrupted:
            raise
        signal.signal(signal.SIGINT, handler)
        saved = next(c.step for c in trainer.callbacks if isinstance(c, CheckpointStep))
        raise Interrupted(interrupted_message(module.train_cfg, Path(trainer.default_root_dir), trainer.global_step,
                                             saved)) from None


def run_train(recipe: Recipe, extra_callbacks: Sequence[Callback] = (), trust_checkpoint: bool = False) -> dict:
    """Fit the recipe's draft on its distilled data; returns the summary written to train_summary.json.
    `extra_callbacks` join the trainer's own (tools/profile_train.py profiles steps with one).
    `trust_checkpoint`: the command line's consent to resume a DeepSpeed checkpoint this user did not sign."""
    cfg, run_dir = recipe.train, Path(recipe.train.output_dir)
    spec = get_method(recipe.method_name)
    claim_run_dir(run_dir)
    distill_dirs = [recipe.distill.output_dir, *cfg.extra_distilled]
    dataset = load_distilled(distill_dirs, all_columns=spec.records is not None)
    resume_from = resume_path(cfg, run_dir)
    if resume_from is None and (run_dir / "checkpoints").is_dir():
        log.warning("%s holds a run: this new run replaces its checkpoints, best/ and last/ as it goes "
                    "(train.resume=auto would continue it)", run_dir)
    if resume_from is not None:  # DeepSpeed's files: the strategy checks them (their recipe: the run's recipe.yaml)
        state = None if is_deepspeed_checkpoint(resume_from) else check_checkpoint_file(resume_from)
        check_resume_recipe(resume_from, state, recipe)
        del state  # memory-mapped: the file's space is freed once a new checkpoint replaces it
    trainer = build_trainer(cfg, run_dir, recipe, resume_from, extra_callbacks, spec.monitor,  # strategy first
                            trust_checkpoint)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    device = trainer.strategy.root_device
    train_idx, val_idx = split_distilled(distill_dirs, len(dataset), recipe.data.val_fraction, cfg.seed)
    if spec.records is None:
        features, rows, info, data_class = build_features(recipe, spec, dataset, distill_dirs, device,
                                                          shard_target(recipe, device))
        token_counts = answer_token_counts(dataset, train_idx, info.vocab_size)
    else:  # the method's own records: no target features, no target in memory
        features, rows, info = None, dataset, load_target_info(recipe.target)
        data_class, token_counts = partial(RecordData, collate=spec.records.collate), None
    ctx = DraftContext(target=info, token_counts=token_counts, activation_checkpointing=cfg.activation_checkpointing,
                       compile=compile_enabled(cfg.compile_setting(), device),
                       warm_start=warm_start_draft(spec, recipe.method, info),
                       base=load_base(spec, recipe.method, info))
    module = DraftModule(spec, recipe.method, cfg, ctx, features)
    data = data_class(rows, recipe.data, cfg, train_idx, val_idx)
    data.batch_stream = module.batch_stream(device)  # train.prefetch_features
    started = time.perf_counter()
    fit(trainer, module, data, resume_from)
    seconds = time.perf_counter() - started
    step_times = next(c for c in trainer.callbacks if isinstance(c, StepTimes))
    summary = {"steps": trainer.global_step, "tokens": module.tokens_seen, "seconds": seconds,
               "tokens_per_s": module.fit_tokens / seconds,
               "steady_tokens_per_s": step_times.steady_tokens_per_s(max(1, len(step_times.rows) // 5)),
               "train_rows": len(train_idx), "val_rows": len(val_idx), "peak_gpu_memory_bytes": peak_memory(device),
               "monitor": f"val/{spec.monitor}",  # what picked best/ (τ_sim for drafts, the method's own else)
               "best": next(c.best for c in trainer.callbacks if isinstance(c, DraftSnapshots))}
    if trainer.is_global_zero:
        write_json(run_dir / "train_summary.json", summary)
    return summary
