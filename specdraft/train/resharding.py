"""Resume a DeepSpeed ZeRO checkpoint on another number of GPUs (or another ZeRO stage).

ZeRO partitions the optimizer state (stages 1-2) and the weights too (stage 3) across the data-parallel ranks
that saved a checkpoint, and DeepSpeed's loader refuses any other data-parallel size ("Automatic adjustment of
ZeRO's optimizer state partitioning with a new world size is not currently supported"). DeepSpeed's own answer
is the universal checkpoint: `deepspeed.checkpoint.ds_to_universal` writes each parameter's fp32 weight and
Adam moments as whole tensors, and an engine configured with `"checkpoint": {"load_universal": true}`
re-partitions them for its own world size (ZeRO 1-3 in DeepSpeed 0.19). It knows torch's Adam moments only:
AdamW8bitFused's 8-bit ones (train.optimizer=adamw8bit_fused) go into it as float32 (`float32_moments`) and are
made 8-bit again after the load (`requantize_after_load`).

`ReshardingDeepSpeedStrategy` is Lightning's DeepSpeedStrategy plus that: before the engine is built it reads
the checkpoint's data-parallel size and stage; when they differ from this run's, rank 0 converts the checkpoint
(once, atomically, beside the original: CKPT/checkpoint_universal + CKPT/latest_universal; reused while the
original is unchanged) and the engine loads it universally. Everything is restored: draft weights, AdamW
moments and step, and (through Lightning's client state) the LR scheduler, loop position, data position and RNG.

DeepSpeed's files are unpickled (weights_only=False), so before any of them is read the checkpoint must carry a
manifest that this user's runs signed at save time, or the command line must say `--trust-checkpoint`
(specdraft/train/manifest.py).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.trainer.states import TrainerFn

from specdraft.core.errors import SpecdraftError
from specdraft.core.io import TMP_PREFIX, fsync_tree, publish_dir, recover, temp_beside, write_error, write_text
from specdraft.train.deepspeed_step import merge_config, single_rank_config, zero_step_on_device
from specdraft.train.manifest import refusal, sign_checkpoint
from specdraft.train.zero3 import drop_module_hooks, persist_weights, persistence_config

log = logging.getLogger(__name__)

UNIVERSAL_TAG = "checkpoint_universal"
LATEST_UNIVERSAL = "latest_universal"
SOURCE_RECORD = "source.json"


@dataclass(frozen=True)
class ZeroLayout:
    world_size: int
    """Data-parallel ranks that saved the checkpoint."""
    stage: int
    """ZeRO stage it was saved with."""


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    """Lightning saves DeepSpeed checkpoints as directories with DeepSpeed's `latest` tag file."""
    return (Path(path) / "latest").is_file()


def _tag_dir(checkpoint: Path) -> Path:
    return checkpoint / (checkpoint / "latest").read_text().strip()


def zero_layout(checkpoint: str | Path) -> ZeroLayout:
    """The data-parallel size and ZeRO stage a DeepSpeed checkpoint was saved with (from its model states file,
    memory-mapped: the weights are not read). DeepSpeed's format is a full pickle: call it on a checkpoint that
    passed `manifest.refusal` only."""
    import torch

    tag_dir = _tag_dir(Path(checkpoint))
    states = sorted(tag_dir.glob("*model_states.pt"))
    if not states:
        raise FileNotFoundError(f"no DeepSpeed model states in {tag_dir}")
    saved = torch.load(states[0], map_location="cpu", mmap=True, weights_only=False)
    stage = int((saved.get("ds_config") or {}).get("zero_optimization", {}).get("stage", 0))
    return ZeroLayout(world_size=int(saved["dp_world_size"]), stage=stage)


def _source_record(tag_dir: Path) -> dict:
    return {path.name: [path.stat().st_size, path.stat().st_mtime_ns] for path in sorted(tag_dir.iterdir())
            if path.is_file()}


def universal_is_current(checkpoint: Path) -> bool:
    """A universal copy exists and was made from the checkpoint's current files."""
    record = checkpoint / UNIVERSAL_TAG / SOURCE_RECORD
    return record.is_file() and (checkpoint / LATEST_UNIVERSAL).is_file() and \
        json.loads(record.read_text()) == _source_record(_tag_dir(checkpoint))


def convert_to_universal(checkpoint: str | Path, workers: int = 4) -> Path:
    """DeepSpeed's ds_to_universal on a Lightning DeepSpeed checkpoint, into CKPT/checkpoint_universal.

    Written in a temp dir and renamed into place; `latest_universal` (DeepSpeed's tag file for universal
    loading) is written last. Lightning's client state lacks DeepSpeed's universal_checkpoint_info, which
    ds_to_universal injects (inject_missing_state)."""
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    checkpoint = Path(checkpoint)
    tag_dir = _tag_dir(checkpoint)
    tmp = checkpoint / f"{TMP_PREFIX}{UNIVERSAL_TAG}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    source = checkpoint / f"{TMP_PREFIX}float32-moments-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        args = argparse.Namespace(input_folder=str(float32_moments(tag_dir, source)), output_folder=str(tmp),
                                  num_extract_workers=workers, num_merge_workers=max(1, workers // 2),
                                  keep_temp_folder=False, strict=True, inject_missing_state=True)
        ds_to_universal(args)
        write_text(tmp / SOURCE_RECORD, json.dumps(_source_record(tag_dir)))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(source, ignore_errors=True)
    final = checkpoint / UNIVERSAL_TAG
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_text(checkpoint / LATEST_UNIVERSAL, UNIVERSAL_TAG)
    return final


def float32_moments(tag_dir: Path, scratch: Path) -> Path:
    """The folder ds_to_universal reads: `tag_dir` itself, or, when its optimizer states hold AdamW8bitFused's
    8-bit moments (train.optimizer=adamw8bit_fused), `scratch` with those states as float32 exp_avg and exp_avg_sq
    (the Adam moments ds_to_universal re-partitions; `requantize_after_load` makes them 8-bit again) beside links
    to the other files."""
    import torch

    rewritten = {}
    for path in sorted(tag_dir.glob("*optim_states.pt")):
        states = torch.load(path, map_location="cpu", weights_only=False)  # checked: refusal() passed before
        if _dequantize_moments(states):
            rewritten[path.name] = states
    if not rewritten:
        return tag_dir
    scratch.mkdir(parents=True)
    for path in tag_dir.iterdir():
        if path.name in rewritten:
            torch.save(rewritten[path.name], scratch / path.name)
        else:
            (scratch / path.name).symlink_to(path.resolve())
    return scratch


def _dequantize_moments(tree) -> bool:
    """Every optimizer state in `tree` (nested dicts and lists) that holds 8-bit codes replaced in place by its
    float32 moments -> whether there was one."""
    from specdraft.kernels.adamw8bit import dequantized_state

    found = False
    children = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, child in list(children):
        if isinstance(child, dict) and "exp_avg_codes" in child:
            tree[key], found = dequantized_state(child), True
        else:
            found = _dequantize_moments(child) or found
    return found


def requantize_after_load(zero_optimizer) -> int:
    """After a universal load: an AdamW8bitFused's float32 moments made 8-bit again (see `float32_moments`), and
    the ZeRO optimizer's views of the float32 ones let go (it links the 8-bit ones after its next step) -> tensors
    converted (0 for another optimizer)."""
    from specdraft.kernels.adamw8bit import AdamW8bitFused

    base = getattr(zero_optimizer, "optimizer", None)
    converted = base.quantize_moments() if isinstance(base, AdamW8bitFused) else 0
    if converted:
        for group in getattr(zero_optimizer, "bit16_groups", []):
            for param in group:
                mapping = getattr(param, "_hp_mapping", None)
                if mapping is not None and mapping.optim_fragment:
                    mapping.optim_fragment.clear()
        zero_optimizer._hp_optimizer_states_linked = False
    return converted


class ReshardingDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy that resumes `resume_from` whatever world size and stage saved it, once it is
    known to be this user's (its signed manifest) or `trust_checkpoint` (the command line's flag) says so; it signs
    every checkpoint it saves. Its ZeRO-1/2 optimizer steps without host syncs (deepspeed_step.py), and with
    `single_rank_zero` a ZeRO-2 run of one rank all-reduces its gradient bucket whole (deepspeed_step.SINGLE_RANK_ZERO);
    under ZeRO-3, `zero3_persist` (train.zero3_persist: auto, true, false) keeps the engine's weights whole
    (zero3.py)."""

    def __init__(self, *args, resume_from: Optional[str] = None, trust_checkpoint: bool = False,
                 zero3_persist: str = "false", single_rank_zero: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.resume_from, self.trust_checkpoint, self.zero3_persist = resume_from, trust_checkpoint, zero3_persist
        self.single_rank_zero = single_rank_zero
        """Whether this run decides reduce_scatter from its world size (False: the recipe's train.deepspeed sets it)."""
        self.restored_from: Optional[ZeroLayout] = None
        """The saved layout when the checkpoint was loaded universally (resharded), else None."""
        self.whole_weights = False
        """ZeRO-3 keeps every weight of the engine whole and runs without its module hooks (zero3.py)."""

    def check_resume_trusted(self) -> None:
        """Rank 0 checks the checkpoint's manifest and every rank learns the verdict, before anything is unpickled."""
        message = refusal(self.resume_from, self.trust_checkpoint) if self.is_global_zero else None
        message = self.broadcast(message)
        if message is not None:
            raise SpecdraftError(message)

    def setup(self, trainer) -> None:
        if self.resume_from and is_deepspeed_checkpoint(self.resume_from) \
                and trainer.state.fn == TrainerFn.FITTING:
            self.check_resume_trusted()
            saved = zero_layout(self.resume_from)
            if (saved.world_size, saved.stage) != (self.world_size, self.config["zero_optimization"]["stage"]):
                checkpoint = Path(self.resume_from)
                if self.is_global_zero and not universal_is_current(checkpoint):
                    log.info("converting %s (ZeRO-%d on %d ranks) to a DeepSpeed universal checkpoint",
                             checkpoint, saved.stage, saved.world_size)
                    convert_to_universal(checkpoint)
                    sign_checkpoint(checkpoint)  # the universal copy is made from files just checked
                self.barrier("universal checkpoint")
                self.config.setdefault("checkpoint", {})["load_universal"] = True
                self.restored_from = saved
        super().setup(trainer)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        client_state = super().load_checkpoint(checkpoint_path, weights_only)
        if self.restored_from is not None:
            requantize_after_load(self.deepspeed_engine.optimizer)
        return client_state

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        if self.single_rank_zero:  # the ranks are known now, and the engine is built from self.config below
            merge_config(self.config, single_rank_config(self.config["zero_optimization"]["stage"], self.world_size))
        if self.zero_stage_3 and self._persist(model):
            self.config["zero_optimization"].update(persistence_config(model))
        engine, zero_optimizer = super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)
        zero_step_on_device(zero_optimizer)  # no host syncs a ZeRO-1/2 step (deepspeed_step.py)
        self.whole_weights = self.zero_stage_3 and drop_module_hooks(zero_optimizer, engine.module)
        return engine, zero_optimizer

    def _persist(self, model) -> bool:
        import torch

        memory = torch.cuda.get_device_properties(self.root_device).total_memory if self.zero3_persist == "auto" \
            else 0
        return persist_weights(self.zero3_persist, model, memory)

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        """Every rank writes its files into one new directory beside `filepath` (rank 0's), flushes them; rank 0
        then signs it and swaps it in for the previous checkpoint (`publish_dir`): a save killed or refused by
        the disk leaves the previous checkpoint whole, and the next save clears what it left (`recover`)."""
        final = Path(self.broadcast(str(filepath)))  # every rank writes into rank 0's path
        tmp = Path(self.broadcast(str(temp_beside(final))))
        if self.is_global_zero:
            recover(final)
        problem = None
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            fsync_tree(tmp)  # each rank its own writes (the page cache of its node)
        except OSError as err:
            problem = str(write_error(final, err))
        self.barrier("checkpoint written")
        if self.is_global_zero and problem is None:
            try:
                sign_checkpoint(tmp)
                publish_dir(tmp, final)
            except SpecdraftError as err:
                problem = str(err)
        failed = self.reduce_boolean_decision(problem is not None, all=False) if self.world_size > 1 else \
            problem is not None
        if failed:  # any rank's failure stops them all
            if self.is_global_zero:
                shutil.rmtree(tmp, ignore_errors=True)
            raise SpecdraftError(problem or f"cannot write {final}: another rank's part of the checkpoint failed "
                                            f"(its log says why); the previous checkpoint is kept")
