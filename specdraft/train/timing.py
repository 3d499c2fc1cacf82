"""Per-step wall times of a training run: what throughput is measured from, start-up excluded.

`StepTimes` writes RUN_DIR/logs/step_times.csv on rank 0, one line per logged optimizer step
(train.log_every_steps):

    step          the global step just finished (1 = the first optimizer step)
    fit_seconds   seconds from this fit's first training step start to the end of `step`, GPU work included
    tokens        tokens all ranks have read since this fit started (attention mask ones, not padding)

On a GPU the times are CUDA events recorded at those step ends (the end of the device's work, not of the host's
queueing), read once they have passed (specdraft.train.device_reads): no step waits for the device. A line is
written once its event has passed (within the next steps; the last ones when training ends). A resumed run appends
its own lines (steps continue, fit_seconds and tokens restart at 0). `steady_rate` gives tokens/s over the logged
steps after the warm-up ones (compiles, allocator growth).
"""
from __future__ import annotations

import contextlib
import csv
import time
from pathlib import Path
from typing import List, Optional, Tuple

from lightning.pytorch.callbacks import Callback

from specdraft.train.device_reads import Deferred, Stash, elapsed_ms

STEP_TIMES_FILE = "step_times.csv"
COLUMNS = ("step", "fit_seconds", "tokens")


class StepTimes(Callback):
    """Records (step, fit_seconds, tokens) at every logged step; rank 0 appends them to logs/step_times.csv."""

    def __init__(self, log_dir: Path, every_steps: int):
        self.path, self.every_steps = Path(log_dir) / STEP_TIMES_FILE, max(1, every_steps)
        self.rows: List[Tuple[int, float, int]] = []
        self.marks = Deferred()
        self._start: Optional[Stash] = None
        self._started: Optional[float] = None
        self._tokens_at_start = 0
        self._last_marked = -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._started is None:
            self._started = time.perf_counter()
            self._start = Deferred().stash(0, trainer.strategy.root_device, {})
            self._tokens_at_start = _tokens_before_this_batch(pl_module, batch, trainer.world_size)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if is_logged_step(step, self.every_steps) and step != self._last_marked:  # not within an accumulation
            self._last_marked = step
            tokens = pl_module.tokens_seen - self._tokens_at_start
            self.marks.stash(step, trainer.strategy.root_device, {},
                             {"seconds": time.perf_counter() - self._started, "tokens": tokens})
        self._write(trainer, wait=False)

    def on_train_end(self, trainer, pl_module):
        self._write(trainer, wait=True)

    def on_exception(self, trainer, pl_module, exception):
        with contextlib.suppress(OSError):  # the exception on its way may be the disk's: the other callbacks run
            self._write(trainer, wait=False)  # what has passed; the device may be what failed

    def _write(self, trainer, wait: bool) -> None:
        """The rows whose step end has passed on the device (all with `wait`): to `rows`, and rank 0's to the file."""
        for mark in self.marks.ready(wait):
            seconds = mark.values["seconds"] if mark.event is None else elapsed_ms(self._start, mark) / 1e3
            row = (mark.key, seconds, int(mark.values["tokens"]))
            self.rows.append(row)
            if trainer.is_global_zero:
                self._append(row)

    def _append(self, row: Tuple[int, float, int]) -> None:
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", newline="") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(COLUMNS)
            writer.writerow([row[0], f"{row[1]:.6f}", row[2]])

    def steady_tokens_per_s(self, warmup_rows: int) -> Optional[float]:
        """Tokens/s of this fit after its first `warmup_rows` logged steps (None with too few of them)."""
        return steady_rate(self.rows, warmup_rows)


def is_logged_step(steps_done: int, every_steps: int) -> bool:
    """Whether the optimizer step that brings the count to `steps_done` is logged: every `every_steps` steps. The
    one rule for the module's metrics (DraftModule) and the step times here."""
    return steps_done > 0 and steps_done % max(1, every_steps) == 0


def _tokens_before_this_batch(pl_module, batch, world_size: int) -> int:
    """The module's token count before `batch`, which it has already counted (on_before_batch_transfer)."""
    return pl_module.tokens_seen - pl_module.batch_tokens(batch) * world_size


def steady_rate(rows: List[Tuple[int, float, int]], warmup_rows: int) -> Optional[float]:
    """rows of (step, fit_seconds, tokens) of one fit -> tokens/s from the end of row `warmup_rows - 1` (the
    first `warmup_rows` rows are warm-up) to the last row; None when that leaves no interval."""
    start = max(0, warmup_rows - 1)
    if len(rows) - start < 2 or rows[-1][1] <= rows[start][1]:
        return None
    return (rows[-1][2] - rows[start][2]) / (rows[-1][1] - rows[start][1])


def read_step_times(path: Path) -> List[Tuple[int, float, int]]:
    """The last fit's rows of a step_times.csv (a resumed run's fit starts where fit_seconds goes back)."""
    with open(path) as handle:
        rows = [(int(r["step"]), float(r["fit_seconds"]), int(r["tokens"])) for r in csv.DictReader(handle)]
    start = max((i for i in range(1, len(rows)) if rows[i][1] < rows[i - 1][1]), default=0)
    return rows[start:]
