"""What keeps a training run's files safe: checkpoints written whole, after the validation they follow, the run
directory claimed before anything is written, and a resume refused when its recipe changed what the checkpoint was
trained with.

- `AtomicCheckpointIO`: Lightning's checkpoint files (checkpoints/last.ckpt, SLURM's hpc_ckpt_N.ckpt) are written
  into a temporary file beside their destination, flushed to the disk and renamed over it. Lightning's own writer
  goes through an fsspec transaction whose temporary file lies in the system's temp directory: on another
  filesystem its "rename" is a copy, which a kill leaves truncated, the previous checkpoint already gone.
  (DeepSpeed's checkpoint directories: `ReshardingDeepSpeedStrategy.save_checkpoint`, the same way.)
- `LastCheckpoint`: checkpoints/last.ckpt after each validation, so the checkpoint holds that validation's outcome
  (the best score so far, the RNG after it): a resumed run keeps the same best/ as an uninterrupted one.
- `claim_run_dir`: train.output_dir must be new, empty or a run's (RUN_FILES), and writable, before the data or
  the target load (nothing is written there before training starts).
- `check_resume_recipe`: the recipe resumed with against the one the checkpoint's run saved; only the keys of
  RESUME_SAFE may differ.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import OmegaConf

from specdraft.config import Recipe
from specdraft.core.errors import SpecdraftError
from specdraft.core.io import atomic_file, check_output_dir, check_writable
from specdraft.drafts import RECIPE_FILE
from specdraft.recipes import recipe_to_yaml

log = logging.getLogger(__name__)

RUN_FILES = (RECIPE_FILE, "checkpoints", "best", "last", "logs", "features", "train_summary.json")
"""What a training run writes into its directory: any of them marks the directory as a run's."""
LAST_CHECKPOINT = "last.ckpt"

RESUME_SAFE = {
    "train.max_steps": "the run goes on to the new count (the cosine schedule then decays to it)",
    "train.val_every_steps": "validation and checkpoint cadence",
    "train.log_every_steps": "logging cadence",
    "train.resume": "where to resume from",
    "train.output_dir": "where the run is (a moved run directory)",
    "train.devices": "GPUs per node (the data stream and ZeRO partitions are dealt anew)",
    "train.num_nodes": "nodes (as train.devices)",
    "train.strategy": "among the kinds that save the same checkpoint format (auto/ddp, or DeepSpeed stages)",
    "train.num_workers": "DataLoader worker processes",
    "train.compile": "speed only", "train.cuda_graphs": "speed only", "train.prefetch_features": "speed only",
    "train.prefetch_start": "speed only", "train.activation_checkpointing": "memory only (the same gradients)",
    "train.shard_target": "memory only", "train.zero3_persist": "memory only",
    "train.optimizer": "among the AdamW kinds: the moments carry over (adamw's quantized on load for the 8-bit ones)",
    "target.trust_remote_code": "the command line's consent, never the file's",
    "distill": "how the data were made (distill.output_dir, the data trained on, excepted)",
    "eval": "evaluation settings", "runtime": "runtime settings",
}
"""Recipe keys (or whole sections) a resumed run may change, and why each is safe; docs/training.md lists them."""
RESUME_UNSAFE = ("distill.output_dir",)
"""Keys inside a safe section that may not change: the training data."""


def holds_run(directory: Path) -> bool:
    """A training run's directory: it holds one of RUN_FILES."""
    return any((directory / name).exists() for name in RUN_FILES)


def claim_run_dir(run_dir: Path) -> None:
    """train.output_dir: a new or empty directory, or a run's; writable. Anything else is one line naming it,
    before the data and the target load; nothing is written."""
    check_output_dir(run_dir, holds_run, "a training run", flag="")
    check_writable(run_dir)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint files written whole or not at all: torch.save into a temporary file beside the
    destination (through a Python file, so that a full disk is an OSError naming its cause), flushed, then renamed
    over it; a full or read-only disk is one line, and the previous checkpoint stays as it was."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as handle:
                torch.save(checkpoint, handle)


class LastCheckpoint(Checkpoint):
    """checkpoints/last.ckpt after every validation of the fit (Lightning runs Checkpoint callbacks after the
    others: DraftSnapshots has recorded the validation's best score), the last step's included. Every rank calls
    the save: DeepSpeed saves its partitions collectively."""

    def __init__(self, checkpoint_dir: Path):
        self.path = checkpoint_dir / LAST_CHECKPOINT
        self.saved_step: Optional[int] = None

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING or self.saved_step == trainer.global_step:
            return
        trainer.save_checkpoint(self.path, weights_only=False)  # the full state: what a resume needs
        self.saved_step = trainer.global_step


def flat_recipe(data, prefix: str = "") -> Dict[str, object]:
    """{dotted key: value} of a recipe's nested mapping (lists kept whole)."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_recipe(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def resume_safe(key: str) -> bool:
    """Whether a resumed run may change `key` (RESUME_SAFE, a key or its section; RESUME_UNSAFE excepted)."""
    if key in RESUME_UNSAFE:
        return False
    return any(key == safe or key.startswith(f"{safe}.") for safe in RESUME_SAFE)


def recipe_changes(saved_yaml: str, recipe: Recipe) -> List[str]:
    """The keys, outside RESUME_SAFE, whose values differ between the saved recipe (YAML text) and `recipe` (a key
    one of them lacks, from another version of specdraft, is not compared)."""
    saved = flat_recipe(OmegaConf.to_container(OmegaConf.create(saved_yaml)))
    current = flat_recipe(OmegaConf.to_container(OmegaConf.create(recipe_to_yaml(recipe))))
    return sorted(key for key in set(saved) & set(current) if saved[key] != current[key] and not resume_safe(key))


def saved_recipe(checkpoint: Path, state: Optional[dict]) -> Optional[tuple]:
    """(YAML text, where it came from) of the recipe a checkpoint was trained with: the one its save carried
    (`state`, a file checkpoint read), else the recipe.yaml of its run directory; None when there is neither."""
    callbacks = (state or {}).get("callbacks") or {}
    for callback_state in callbacks.values():
        if isinstance(callback_state, dict) and isinstance(callback_state.get("recipe"), str):
            return callback_state["recipe"], "the recipe saved in it"
    for directory in _run_dirs(checkpoint):
        if (directory / RECIPE_FILE).is_file():
            return (directory / RECIPE_FILE).read_text(), str(directory / RECIPE_FILE)
    return None


def _run_dirs(checkpoint: Path) -> Iterable[Path]:
    """Where a checkpoint's run directory may be: RUN/checkpoints/last.ckpt, RUN/hpc_ckpt_N.ckpt."""
    return (checkpoint.parent, checkpoint.parent.parent)


def check_resume_recipe(checkpoint: str, state: Optional[dict], recipe: Recipe) -> None:
    """Refuse, in one line naming the keys, to resume `checkpoint` with a recipe that changed anything but the
    keys of RESUME_SAFE."""
    found = saved_recipe(Path(checkpoint), state)
    if found is None:
        log.warning("resuming %s: no recipe of its run found to compare this one with", checkpoint)
        return
    text, source = found
    try:
        changed = recipe_changes(text, recipe)
    except Exception as err:  # noqa: BLE001 (a hand-edited or truncated recipe.yaml)
        raise SpecdraftError(f"cannot read the recipe {source} that {checkpoint} was trained with "
                             f"({type(err).__name__}); restore it, or train into a new train.output_dir") from None
    if changed:
        shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
        raise SpecdraftError(f"refusing to resume {checkpoint}: this recipe changes {shown} from the one it was "
                             f"trained with ({source}); a resumed run may change only max_steps, the validation "
                             f"and logging cadence, paths, devices and speed or memory settings (docs/training.md "
                             f"lists them): set the others back, or train into a new train.output_dir")
