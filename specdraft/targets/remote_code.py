"""Code from elsewhere runs only when the user says so on the command line, for that command.

A target may ship Python (an `auto_map` in its config.json: its own configuration, model or tokenizer classes).
Transformers runs that code when asked with `trust_remote_code=True`. specdraft asks only when the command line
carries `--trust-remote-code`: `with_remote_code` sets the target's setting from that consent alone, whatever a
recipe, an export's config.json or a run's saved recipe says. A file that asks is told, in a warning naming the
model, that its code will not run; a consent is told which model's code will.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import replace

from specdraft.config import TargetConfig
from specdraft.core.errors import SpecdraftError, error_summary

log = logging.getLogger(__name__)

REMOTE_CODE_FLAG = "--trust-remote-code"


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    """A warning printed once per process: a command reads the same target's settings from several files."""
    log.warning(message)


def with_remote_code(cfg: TargetConfig, consent: bool, source: object) -> TargetConfig:
    """`cfg` with trust_remote_code set by `consent` (the command line's flag) alone. `source`: the file `cfg` came
    from, named in the warning when it asked for remote code."""
    if consent:
        _warn_once(f"{REMOTE_CODE_FLAG}: the Python code that target {cfg.path} ships (its config.json's auto_map) "
                   f"will run")
    elif cfg.trust_remote_code:
        _warn_once(f"{source} sets target.trust_remote_code: true; the code that target {cfg.path} ships will not "
                   f"run (a file cannot turn it on): pass {REMOTE_CODE_FLAG} on the command line to run it")
    return replace(cfg, trust_remote_code=consent)


def target_error(cfg: TargetConfig, action: str, err: Exception) -> SpecdraftError:
    """A failure to `action` (e.g. "load", "read the config of") target `cfg` as one line; a refusal to run the
    target's own code says how to allow it."""
    if "trust_remote_code" in str(err):
        return SpecdraftError(f"cannot {action} target {cfg.path!r}: it ships its own Python code (an auto_map in "
                              f"its config.json), which was not run; pass {REMOTE_CODE_FLAG} to run it")
    return SpecdraftError(f"cannot {action} target {cfg.path!r}: {error_summary(err)}")
