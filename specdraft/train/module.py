"""One LightningModule for every method: a feature source (specdraft.train.features: the frozen target online,
or features stored on disk) gives each batch's target features, the method's hooks do the rest. Nothing here
knows a method's name."""
from __future__ import annotations

import logging
import math
import random
import time
from collections import defaultdict
from typing import Any, Optional

import lightning as L
import numpy as np
import torch

from specdraft.config import OPTIMIZERS, PREFETCH_NEEDS, TrainConfig
from specdraft.core.errors import SpecdraftError, choices_error
from specdraft.kernels.adamw8bit import AdamW8bitFused
from specdraft.layers.zero import gathered
from specdraft.core.types import DraftBatch, DraftContext
from specdraft.methods.base import MethodSpec
from specdraft.train.device_reads import Deferred
from specdraft.train.features import OnlineFeatures, ShardedOnlineFeatures
from specdraft.train.graphs import GraphNeeds, StepGraphs, graphs_enabled
from specdraft.train.offload import Offload
from specdraft.train.prefetch import PREFETCH_KEY, FeaturePrefetch, PrefetchNeeds, pop_seq, prefetch_enabled
from specdraft.train.timing import is_logged_step

log = logging.getLogger(__name__)


class DraftModule(L.LightningModule):
    def __init__(self, spec: MethodSpec, method_cfg: Any, train_cfg: TrainConfig, ctx: DraftContext, features):
        """`features`: a feature source of specdraft.train.features, the frozen target model (online), or None for
        a method trained on its own records (its loss receives the collated batch as it is)."""
        super().__init__()
        self.spec, self.method_cfg, self.train_cfg, self.ctx = spec, method_cfg, train_cfg, ctx
        self.feature_layers = spec.feature_layers(method_cfg, ctx.target)
        if isinstance(features, torch.nn.Module):
            features = OnlineFeatures(features, self.feature_layers)
        self.features = features  # holds the frozen target, not a submodule: never checkpointed
        self.sharded_target = None  # ZeRO-3 with train.shard_target: the target, a submodule the engine gathers
        self.draft = None
        self._val_metrics = defaultdict(list)
        self._train_metrics = Deferred()
        self.train_metrics: dict = {}
        """The last training metrics written (train/loss, train/tokens_per_s, the method's)."""
        self.tokens_seen, self._fit_started = 0, None
        """tokens_seen: the whole run's tokens, restored on resume (every checkpoint carries it)."""
        self._tokens_at_train_start = 0
        self.step_graphs: Optional[StepGraphs] = None
        """The training steps' CUDA graphs (train.cuda_graphs), set up at the first step; None: eager steps."""
        self._graphs_resolved = False
        self.prefetch: Optional[FeaturePrefetch] = None
        """The next batch's features computed ahead (train.prefetch_features): made for the training loader
        (`batch_stream`), dropped at the first step if the setting resolves off; None: each step computes its own."""
        self._step_seq: Optional[int] = None
        """The number of the batch the current training step holds (None: an unnumbered batch)."""
        self.offload: Optional[Offload] = Offload() if train_cfg.activation_offload else None
        """The step's kept activations moved to host memory (train.activation_offload); None: they stay."""

    @property
    def target_model(self):
        """The frozen target when features are computed online, else None."""
        return getattr(self.features, "model", None)

    def setup(self, stage: str):  # Lightning hook: the ranks' process group exists, no zero.Init is active
        self._build_sharded_target()

    def configure_model(self):  # Lightning hook (sharded init); idempotent
        if self.draft is None:
            self.draft = self.spec.build(self.method_cfg, self.ctx)
            if self.spec.initialize is not None and self.ctx.warm_start is not None:  # a resume overwrites it
                with gathered(list(self.draft.parameters())):
                    self.spec.initialize(self.draft, self.method_cfg, self.ctx)
            if self.spec.bind_target is not None:
                self.spec.bind_target(self.draft, self.target_model)

    def _build_sharded_target(self):
        """Under ZeRO-3 with a sharded target: build it partitioned (its own zero.Init, in the target's dtype
        whatever the training precision) as a submodule, so that DeepSpeed's engine gathers its weights layer
        by layer in each forward. It is frozen (outside the optimizer), left out of checkpoints
        (exclude_frozen_parameters) and rebuilt from its weights on resume. Built before configure_model, whose
        draft the DeepSpeed strategy creates under a zero.Init of the training precision."""
        if not isinstance(self.features, ShardedOnlineFeatures) or self.sharded_target is not None:
            return
        self.sharded_target = self.features.build()
        self.strict_loading = False  # checkpoints hold the draft only

    def train(self, mode: bool = True):
        """Lightning puts the module in training mode at every fit and after every validation; the frozen
        target, a submodule when sharded, stays in eval mode (no dropout)."""
        super().train(mode)
        if self.sharded_target is not None:
            self.sharded_target.eval()
        return self

    def on_fit_start(self):
        self._place_on_device()
        self._fit_started = time.perf_counter()

    def on_train_start(self):  # after any checkpoint is restored (DeepSpeed restores after on_fit_start)
        self._tokens_at_train_start = self.tokens_seen

    @property
    def fit_tokens(self) -> int:
        """Tokens read by this fit alone (a resumed run's rates count these)."""
        return self.tokens_seen - self._tokens_at_train_start

    def on_validation_start(self):  # `trainer.validate` after fit (or alone) has no fit start
        self._place_on_device()

    def _place_on_device(self):
        """The frozen target and the draft's buffers on the rank's device (idempotent). The device comes from the
        strategy: under ZeRO-3 the module itself is never moved (zero.Init places its parameters), so its
        `device` still reads cpu, and DeepSpeed leaves buffers where they were built."""
        device = self.trainer.strategy.root_device
        if self.features is not None:
            self.features.setup(device, self.global_rank)  # the frozen target in bf16 on GPUs
        for module in self.draft.modules():
            for name, buffer in module.named_buffers(recurse=False):
                module._buffers[name] = buffer.to(device)

    def _draft_batch(self, batch, features=None):
        """`features`: the batch's target features when already computed (prefetched), else computed here."""
        if self.features is None:
            return batch
        return DraftBatch(input_ids=batch["input_ids"], loss_mask=batch["loss_mask"],
                          attention_mask=batch["attention_mask"],
                          features=self.features(batch) if features is None else features,
                          position_ids=batch.get("position_ids"), document_ids=batch.get("document_ids"))

    def on_before_batch_transfer(self, batch, dataloader_idx):
        if self.trainer.training:  # counted on the CPU, before the copy: no device sync in the step
            self.tokens_seen += self.batch_tokens(batch) * self.trainer.world_size
        return batch

    def batch_tokens(self, batch) -> int:
        """What the rates count in one batch: its real tokens, or the records of a method trained on its own."""
        return len(next(iter(batch.values()))) if self.features is None else int(batch["attention_mask"].sum())

    def _loss(self, batch, features=None):
        return self.spec.loss(self.draft, self._draft_batch(batch, features), self.method_cfg)

    def _train_loss(self, batch):
        """The step's loss, replayed from a CUDA graph when train.cuda_graphs captures it (its backward then
        hands the replayed gradients to the parameters), else computed here, on the features prefetched for this
        batch when there are some."""
        if not self._graphs_resolved:
            self._graphs_resolved = True
            self._set_up_step_graphs(packed=isinstance(batch, dict) and batch.get("position_ids") is not None)
            self._set_up_prefetch()
        if self.step_graphs is not None:
            return self.step_graphs(batch)
        features = None if self.prefetch is None else self.prefetch.take(self._step_seq)
        if self.offload is None:
            return self._loss(batch, features)
        with self.offload.context():
            return self._loss(batch, features)

    def _set_up_step_graphs(self, packed: bool) -> None:
        """train.cuda_graphs resolved for this run (at its first step: `packed`, whether its rows are packed)."""
        cfg, device = self.train_cfg, self.trainer.strategy.root_device
        needs = GraphNeeds(cuda=torch.device(device).type == "cuda", single_device=self.trainer.world_size == 1,
                           strategy=cfg.strategy, checkpointing=cfg.activation_checkpointing,
                           features_graph_safe=self.features is not None and self.features.graph_safe,
                           method_graph_safe=self.spec.graph_safe_loss, unpacked_rows=not packed,
                           offload=cfg.activation_offload)
        if graphs_enabled(cfg.cuda_graphs, needs):
            params = [param for group in self._param_groups() for param in group["params"]]
            self.step_graphs = StepGraphs(self._loss, params, strict=cfg.cuda_graphs == "true")

    def _prefetch_needs(self, device, eager_step: bool = True) -> PrefetchNeeds:
        return PrefetchNeeds(cuda=torch.device(device).type == "cuda", eager_step=eager_step,
                             features_prefetchable=self.features is not None and self.features.prefetchable)

    def batch_stream(self, device):
        """What the training loader's batches pass through for train.prefetch_features (FeaturePrefetch.track:
        numbered, read one ahead) when it may turn on for this run on `device`, else None; true where it cannot
        is an error here. Whether it does is settled at the first step (not when a CUDA graph captures it)."""
        if not prefetch_enabled(self.train_cfg.prefetch_features, self._prefetch_needs(device)):
            return None
        self.prefetch = FeaturePrefetch(self.features, device, self.train_cfg.prefetch_start)
        return self.prefetch.track

    def _set_up_prefetch(self) -> None:
        """train.prefetch_features resolved for this run at its first step, once train.cuda_graphs is."""
        needs = self._prefetch_needs(self.trainer.strategy.root_device, eager_step=self.step_graphs is None)
        setting = self.train_cfg.prefetch_features
        if not prefetch_enabled(setting, needs):
            self.prefetch = None
        if self.prefetch is not None and self.prefetch.start == "gradients":
            for group in self._param_groups():
                for param in group["params"]:
                    param.register_post_accumulate_grad_hook(lambda _: self.prefetch.mark_gradient())
        unmet = needs.unmet(setting) if setting != "false" else []
        if self.prefetch is not None:
            choice = ("the next batch's target features ahead (on CUDA on a side stream, from the "
                      f"{self.prefetch.start})")
        else:
            choice = "each step computes its own" + (f" (needs {PREFETCH_NEEDS[unmet[0]]})" if unmet else "")
        log.info("%s=%s: %s", PREFETCH_KEY, setting, choice)

    def on_after_backward(self):
        """The step's backward is enqueued (under DeepSpeed: engine.backward, whose end enqueues the gradients'
        reductions, has returned; engine.step has not run): the next batch's features start, under the
        precision's autocast as the step's own would."""
        if self.prefetch is not None and self._step_seq is not None:
            with self.trainer.precision_plugin.train_step_context():
                self.prefetch.after_backward(self._step_seq)

    def training_step(self, batch, batch_idx):
        self._step_seq = pop_seq(batch)
        result = self._train_loss(batch)
        if self._logs_this_step():
            elapsed = time.perf_counter() - self._fit_started
            metrics = {f"train/{k}": v for k, v in result.metrics.items() if k != "loss"}
            tensors = {k: v for k, v in metrics.items() if isinstance(v, torch.Tensor)}
            numbers = {k: float(v) for k, v in metrics.items() if k not in tensors}  # a method's host values
            self._train_metrics.stash(self.trainer.global_step + 1, result.loss.device,
                                      {**tensors, "train/loss": result.loss},
                                      {**numbers, "train/tokens_per_s": self.fit_tokens / max(elapsed, 1e-9)})
        self._write_train_metrics(wait=False)  # off CUDA this step's; on a GPU an earlier one, once it landed
        return result.loss

    def _logs_this_step(self) -> bool:
        """Whether this step's metrics are written (every train.log_every_steps optimizer steps). They are read
        back without waiting for the device (device_reads.Deferred) and written once they have landed, normally in
        the next step, under their own step: Lightning's `self.log` would read them back at the end of the step,
        each read waiting for the device to finish it."""
        return is_logged_step(self.trainer.global_step + 1, self.trainer.log_every_n_steps)

    def _write_train_metrics(self, wait: bool) -> None:
        """The training metrics that have landed (all with `wait`) to the logger, with their step as Lightning
        numbers logged steps (optimizer steps done - 1), and to `train_metrics` (what the progress bar shows)."""
        for stash in self._train_metrics.ready(wait):
            self.train_metrics = stash.values
            if self.logger is not None:
                self.logger.log_metrics({**stash.values, "epoch": self.current_epoch}, step=stash.key - 1)

    def on_train_end(self):
        self._write_train_metrics(wait=True)

    def validation_step(self, batch, batch_idx):
        result = self._loss(batch)
        for name, value in result.metrics.items():  # kept on the device: no sync per batch
            self._val_metrics[name].append(torch.as_tensor(value, device=self.trainer.strategy.root_device)
                                           .detach().float())

    def on_validation_epoch_end(self):
        means = {f"val/{k}": float(torch.stack(v).mean()) for k, v in self._val_metrics.items()}
        self._val_metrics.clear()
        for name, value in means.items():  # sync_dist averages the ranks' means
            self.log(name, value, sync_dist=True)

    def _param_groups(self) -> list:
        """The optimizer's parameter groups: the method's, or every parameter of the draft that requires grad."""
        return self.spec.param_groups(self.draft) if self.spec.param_groups else \
            [{"params": [p for p in self.draft.parameters() if p.requires_grad]}]

    def configure_optimizers(self):
        cfg = self.train_cfg
        groups = self._param_groups()
        name = optimizer_choice(cfg, self.trainer.strategy.root_device,
                                [param for group in groups for param in group["params"]])
        optimizer = build_optimizer(name, groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, cfg))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint):
        checkpoint["rng"] = rng_state()
        checkpoint["tokens_seen"] = self.tokens_seen

    def on_load_checkpoint(self, checkpoint):
        """Before Lightning loads the weights: a checkpoint of another draft is one line naming the first tensor
        that does not fit (DeepSpeed restores its weights itself: no state_dict here)."""
        if "state_dict" in checkpoint:
            problem = tensor_mismatch(checkpoint["state_dict"], self.state_dict())
            if problem is not None:
                raise SpecdraftError(f"checkpoint {self.trainer.ckpt_path} does not fit this recipe's draft: "
                                     f"{problem}; resume with the recipe that saved it")
        if "rng" in checkpoint:
            set_rng_state(checkpoint["rng"])
        self.tokens_seen = int(checkpoint.get("tokens_seen", 0))


def tensor_mismatch(saved: dict, own: dict, prefix: str = "draft.") -> Optional[str]:
    """The first draft tensor (names under `prefix`) that `saved` lacks, adds or holds in another shape, as text;
    None when every one fits."""
    saved = {name: tensor for name, tensor in saved.items() if name.startswith(prefix)}
    for name, tensor in own.items():
        if not name.startswith(prefix):
            continue
        if name not in saved:
            return f"it has no tensor {name}"
        if tuple(saved[name].shape) != tuple(tensor.shape):
            return f"tensor {name} has shape {list(saved[name].shape)}, the draft's is {list(tensor.shape)}"
    unexpected = sorted(set(saved) - set(own))
    return f"it has a tensor {unexpected[0]} the draft lacks" if unexpected else None


def optimizer_choice(cfg: TrainConfig, device: torch.device, params: list) -> str:
    """train.optimizer resolved for this run: auto is adamw8bit_fused on a CUDA device when every trained weight
    is float32 (what the optimizer steps: the master weights of mixed precision, not bf16-true's) outside
    deepspeed_stage_3 (whose partitioned state has not been run with it), else adamw."""
    if cfg.optimizer != "auto":
        return cfg.optimizer
    fused = torch.device(device).type == "cuda" and cfg.strategy != "deepspeed_stage_3" \
        and all(param.dtype == torch.float32 for param in params)
    choice = "adamw8bit_fused" if fused else "adamw"
    log.info("train.optimizer=auto: %s", choice)
    return choice


def build_optimizer(name: str, groups, lr: float, weight_decay: float, betas=(0.9, 0.95)) -> torch.optim.Optimizer:
    """train.optimizer over the parameter groups: adamw is PyTorch's default multi-tensor (foreach) AdamW on
    GPUs, not fused=True, which Lightning's mixed precision refuses with gradient clipping ("performs unscaling
    of gradients internally"), seen on an H100; adamw8bit is bitsandbytes' AdamW8bit (blockwise 8-bit moments
    for tensors of 4096 elements or more, float32 below); adamw8bit_fused is specdraft's AdamW8bitFused (the same
    memory, the step one fused Triton kernel per tensor; kernels/adamw8bit)."""
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, betas=betas)
    if name == "adamw8bit_fused":
        return AdamW8bitFused(groups, lr=lr, weight_decay=weight_decay, betas=betas)
    if name == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(groups, lr=lr, weight_decay=weight_decay, betas=betas)
    raise choices_error("train.optimizer", name, OPTIMIZERS)


def rng_state() -> dict:
    """Every RNG's state in types that `torch.load(weights_only=True)` accepts."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                       "has_gauss": has_gauss, "gauss": gauss}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    numpy_state = state["numpy"]
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state((numpy_state["name"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def warmup_cosine(step: int, cfg: TrainConfig) -> float:
    """LR multiplier: linear warmup to 1, then cosine decay to 0.1 at max_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
