"""What a user sees of the libraries specdraft runs on: each of their log lines once, no advertisements, warnings
only where the user can act on them, no progress bar for what takes a blink. The CLI calls `quiet_dependencies()`
first, before any of them is imported: the loggers and filters it sets are looked up by name, so they hold for
libraries imported later. The target loader calls `quiet_transformers_bars()` (it imports Transformers)."""
from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Dict, Tuple

DROPPED_LINES: Dict[str, Tuple[str, ...]] = {
    "lightning.pytorch.utilities.rank_zero": ("💡 Tip", "Detected KeyboardInterrupt"),
    "lightning.fabric.utilities.rank_zero": ("💡 Tip",),
    "DeepSpeed": ("Setting accelerator to CPU",),
}
"""Log lines that give a user nothing to act on, by the logger that writes them (each line's start): Lightning's
advertisements for its cloud services and its Ctrl-C notice (the CLI says what a stopped stage kept instead), and
DeepSpeed's guess at the accelerator on a machine without a GPU (every stage logs the device it runs on)."""

IGNORED_WARNINGS: Tuple[Tuple[str, type], ...] = (
    ("", DeprecationWarning),
    ("", FutureWarning),
    (r"You have overridden `on_before_batch_transfer` in `LightningModule`", UserWarning),
    (r"The '\w+_dataloader' does not have many workers", UserWarning),
    (r"You're resuming from a checkpoint that ended before the epoch ended", UserWarning),
    (r"The `srun` command is available on your system but is not used", UserWarning),
)
"""(message regex, category) of warnings that only a library's own authors can act on: deprecations inside the
libraries, and Lightning's notes on choices the trainer made on purpose (the module counts tokens before a batch
moves to the device; rows are read in the main process; the data module's sampler restores its position on resume,
which Lightning does not see; a stage run outside SLURM on a machine that has `srun` runs there on purpose, and
`specdraft slurm` writes jobs that start it through `srun`)."""


class _DropLines(logging.Filter):
    """Drops the records whose message starts with one of `starts`."""

    def __init__(self, starts: Tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().lstrip().startswith(self.starts)


LINE_FILTERS = {name: _DropLines(starts) for name, starts in DROPPED_LINES.items()}
"""One filter a logger, so that setting them again adds none (logging keeps a filter once)."""


def quiet_dependencies() -> None:
    """Lightning's lines once (its own handler; not also through the root logger's), the lines of DROPPED_LINES
    dropped, the warnings of IGNORED_WARNINGS ignored. Idempotent."""
    logging.getLogger("lightning").propagate = False
    for name, line_filter in LINE_FILTERS.items():
        logging.getLogger(name).addFilter(line_filter)
    for message, category in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


QUIET_BARS = ("Loading weights", "Writing model shards")
"""Transformers' progress bars that flash by (under a second, once a model load, several loads a stage). Downloads
keep their bars (huggingface_hub's own), and so does dequantizing a GGUF target on its first load (seconds)."""


def _quiet_bar(factory: Callable[..., Any], args: tuple, kwargs: dict):
    return factory(*args, **{**kwargs, "disable": True}) if kwargs.get("desc") in QUIET_BARS else \
        factory(*args, **kwargs)


def quiet_transformers_bars() -> None:
    """Transformers draws the bars of QUIET_BARS disabled. Idempotent."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_tqdm_hook(_quiet_bar)
