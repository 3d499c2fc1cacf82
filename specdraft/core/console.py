"""What a user sees of the libraries specdraft runs on, and of specdraft's own waits: each library log line once,
no advertisements, warnings only where the user can act on them, no progress bar for what takes a blink, no log
record written into a progress bar's line, and a line that says what is loading while a model loads.

The CLI calls `quiet_dependencies()` and `log_through_bars()` first, before any library is imported: the loggers
and filters they set are looked up by name, so they hold for libraries imported later. Libraries that bring their
own log handlers (Lightning, DeepSpeed) get them pointed through the bars by `route_library_logs()`, which
`loading()` calls as it ends (the libraries are imported inside such blocks). The target loader calls
`quiet_transformers_bars()` (it imports Transformers)."""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

DROPPED_LINES: Dict[str, Tuple[str, ...]] = {
    "lightning.pytorch.utilities.rank_zero": ("💡 Tip", "Detected KeyboardInterrupt", "GPU available:",
                                              "TPU available:", "HPU available:", "IPU available:"),
    "lightning.fabric.utilities.rank_zero": ("💡 Tip",),
    "DeepSpeed": ("Setting accelerator to CPU",),
}
"""Log lines that give a user nothing to act on, by the logger that writes them (each line's start): Lightning's
advertisements for its cloud services, its Ctrl-C notice (the CLI says what a stopped stage kept instead) and its
census of accelerators, and DeepSpeed's guess at the accelerator on a machine without a GPU (every stage logs the
device it runs on)."""

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


class BarSafeStream:
    """Text onto stderr written through tqdm: the open progress bars are cleared, the text written, the bars drawn
    again below it, so that a log record never lands inside a bar's line. sys.stderr is looked up at each write
    (a test's capture replaces it)."""

    def write(self, text: str) -> int:
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr, end="")
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()


BAR_SAFE_STDERR = BarSafeStream()
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def log_through_bars(level: int = logging.INFO) -> None:
    """The root logger writes to stderr through the bars (`BarSafeStream`), as LOG_FORMAT; as logging.basicConfig,
    nothing changes where the root logger has handlers already."""
    handler = logging.StreamHandler(BAR_SAFE_STDERR)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def route_library_logs() -> None:
    """Every log handler a library attached to the terminal's streams (Lightning's and DeepSpeed's, set up as they
    are imported) writes through the bars to stderr instead: not onto a bar's line, and not onto stdout, which
    carries a command's result alone. Idempotent; cheap (a walk over the loggers)."""
    terminal = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    loggers = [logging.getLogger()] + [logger for logger in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler and handler.stream in terminal:
                handler.setStream(BAR_SAFE_STDERR)


def redraw_every() -> float:
    """Seconds between a bar's redraws on time: every second on a terminal, every half minute into a file (a log
    keeps every frame)."""
    return 1.0 if sys.stderr.isatty() else 30.0


SAME_FRAME_SECONDS = 1.0
"""Within this of a bar's last print a redraw shows the same frame (its elapsed time counts whole seconds)."""


class Ticker:
    """Redraws a tqdm bar every `every` seconds from a daemon thread, so that its elapsed time moves while the work
    it counts takes longer than a redraw (a model load, a training step of seconds); not within a second of the
    bar's own last print, whose frame it would repeat (a file keeps both). `stop()` before closing it."""

    def __init__(self, bar, every: Optional[float] = None):
        self.bar, self.every = bar, redraw_every() if every is None else every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="specdraft-bar", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            if time.time() - getattr(self.bar, "last_print_t", 0.0) >= SAME_FRAME_SECONDS:  # tqdm's clock
                self.bar.refresh()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def ticking(iterable: Iterable, **bar_args) -> Iterator:
    """tqdm over `iterable` (its `bar_args`), redrawn on time while it runs (`Ticker`): a loop whose items take
    minutes (a prompt decoded on a CPU) still shows its elapsed time moving. Closed with the loop (or, stopped by
    an exception, when the loop's frames go)."""
    from tqdm import tqdm

    bar = tqdm(iterable, **bar_args)
    ticker = Ticker(bar)
    try:
        yield from bar
    finally:
        ticker.stop()
        bar.close()


_OPEN_LOADS: List[Any] = []
"""The loading line open now (at most one: a load inside another renames it)."""


@contextlib.contextmanager
def loading(what: str) -> Iterator[None]:
    """While the block runs, one line on a terminal's stderr: `WHAT… 00:12`, redrawn on time (`Ticker`), so that
    a model load of a minute is not a minute of silence. A load inside another renames the open line for its time.
    The line is cleared when the outermost block ends (what follows is the command's own output); the libraries
    imported in the block have their log handlers routed through the bars then (`route_library_logs`). Into a file
    nothing is drawn: frames of a line that is cleared at the end are no record, and beside another bar (a GGUF's
    dequantizing) tqdm draws a file's bars on lines of their own."""
    if _OPEN_LOADS:
        bar = _OPEN_LOADS[0]
        outer = bar.desc
        bar.set_description_str(what)
        try:
            yield
        finally:
            bar.set_description_str(outer)
        return
    if not sys.stderr.isatty():
        try:
            yield
        finally:
            route_library_logs()
        return
    from tqdm import tqdm

    bar = tqdm(total=None, desc=what, bar_format="{desc}… {elapsed}", leave=False, file=sys.stderr)
    ticker = Ticker(bar)
    _OPEN_LOADS.append(bar)
    try:
        yield
    finally:
        _OPEN_LOADS.pop()
        ticker.stop()
        bar.close()
        route_library_logs()
