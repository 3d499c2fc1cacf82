"""A target path `pkg:MODEL` (no slash; MODEL one of specdraft.targets.catalogue.MODELS): the model's GGUF,
assembled once from its installed part packages into specdraft's cache and checked (size and SHA-256).

The assembled file is `$SPECDRAFT_CACHE/models/MODEL/FILE` (default cache ~/.cache/specdraft), written beside itself
under a temporary name, fsynced and renamed, with a marker `FILE.verified` (its digest, size and mtime) written after
it: a later load that finds both agreeing reuses the file without reading it. A file without a valid marker is
checked once in full; a wrong one is removed and assembled again. A machine without the part packages (a lent GPU
machine) uses a cache seeded by tools/gpu/ship_model.py, which writes the same marker (`seed_cache`).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator, List, Optional

from specdraft.core.errors import SpecdraftError
from specdraft.core.io import atomic_file, file_sha256, write_json
from specdraft.targets.catalogue import MODELS, PartModel

log = logging.getLogger(__name__)

PREFIX = "pkg:"
BLOCK = 1 << 22
"""Bytes read and written at a time (4 MiB)."""


def cache_root() -> Path:
    """specdraft's cache: $SPECDRAFT_CACHE, default ~/.cache/specdraft."""
    return Path(os.environ.get("SPECDRAFT_CACHE", Path.home() / ".cache" / "specdraft")).expanduser()


def names_part_model(path: str) -> bool:
    """Whether a target path names a multi-part model (`pkg:MODEL`, no slash) rather than a packaged file."""
    return path.startswith(PREFIX) and "/" not in path[len(PREFIX):]


def part_model(path: str) -> PartModel:
    """`pkg:MODEL` -> its catalogue entry, or one line naming the known ones."""
    name = path[len(PREFIX):]
    if name not in MODELS:
        raise SpecdraftError(f"unknown multi-part model {name!r} in target path {path!r}; valid: "
                             f"{', '.join(sorted(MODELS))} (or pkg:PACKAGE/FILE, a file inside an installed package)")
    return MODELS[name]


def cached_path(model: PartModel) -> Path:
    """Where the assembled GGUF lives (whether or not it is there yet)."""
    return cache_root() / "models" / model.name / model.file_name


def marker_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".verified")


def verified_sha256(gguf: Path) -> Optional[str]:
    """The digest a marker beside `gguf` records, if the marker describes the file as it is now (size and mtime);
    else None (no marker, or the file changed since it was checked)."""
    try:
        marker = json.loads(marker_path(gguf).read_text())
        stat = gguf.stat()
        if marker["size"] == stat.st_size and marker["mtime_ns"] == stat.st_mtime_ns:
            return str(marker["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def write_marker(gguf: Path, sha256: str) -> None:
    """Record that `gguf` as it is now has digest `sha256` (checked by the caller)."""
    stat = gguf.stat()
    write_json(marker_path(gguf), {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})


def install_command(model: PartModel, packages: Optional[List[str]] = None) -> str:
    """`pip install` of the model's part packages (those of `packages`, default all)."""
    wanted = [part for part in model.parts if packages is None or part.package in packages]
    return "pip install " + " ".join(part.requirement for part in wanted)


def part_files(model: PartModel) -> List[Path]:
    """Each part's file in its installed package, in order; one line naming every missing package and the
    `pip install` that brings them."""
    files, missing = [], []
    for part in model.parts:
        spec = importlib.util.find_spec(part.package)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        file = Path(locations[0]) / part.file if locations else None
        if file is None or not file.is_file():
            missing.append(part.package)
        files.append(file)
    if missing:
        which = f"none of its {len(missing)} part packages is installed" if len(missing) == len(model.parts) else \
            f"{len(missing)} of its {len(model.parts)} part packages are not installed ({', '.join(missing)})"
        raise SpecdraftError(f"target pkg:{model.name}: {which}; install them: {install_command(model, missing)}")
    return files


def _reinstall(model: PartModel) -> str:
    return f"reinstall its parts: {install_command(model).replace('install', 'install --force-reinstall', 1)}"


def _digest_error(model: PartModel, what: str, found: str, fix: str) -> SpecdraftError:
    return SpecdraftError(f"target pkg:{model.name}: {what} {found}, not the model's {model.size:,} bytes of sha256 "
                          f"{model.sha256[:16]}...; nothing was kept; {fix}")


@contextlib.contextmanager
def _assembly_lock(final: Path) -> Iterator[None]:
    """One assembly of a model at a time across processes (distill-data workers, training ranks): the others wait,
    then find the cached file."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(final.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _concatenate(model: PartModel, files: List[Path], final: Path) -> None:
    """The parts joined into `final` (temp file beside it, fsync, rename) if their size and digest are the model's;
    else one line, and nothing is left."""
    from tqdm.auto import tqdm

    size = sum(file.stat().st_size for file in files)
    if size != model.size:
        raise _digest_error(model, "its installed parts hold", f"{size:,} bytes", _reinstall(model))
    free = shutil.disk_usage(final.parent).free
    if free < size:
        raise SpecdraftError(f"target pkg:{model.name}: assembling it needs {size / 1e9:.2f} GB in {final.parent}, "
                             f"{free / 1e9:.2f} GB are free (set SPECDRAFT_CACHE to a roomier disk)")
    digest = hashlib.sha256()
    with atomic_file(final) as tmp, open(tmp, "wb") as out, \
            tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=f"assembling {model.name}") as bar:
        for file in files:
            with open(file, "rb") as part:
                for block in iter(lambda: part.read(BLOCK), b""):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
        out.flush()
        os.fsync(out.fileno())
        if digest.hexdigest() != model.sha256:
            raise _digest_error(model, "its installed parts join into sha256", digest.hexdigest()[:16] + "...",
                                _reinstall(model))
    _fsync_dir(final.parent)


def _valid_cached(model: PartModel, final: Path) -> bool:
    """Whether `final` is the model: by its marker (cheap), else by reading it once (then the marker is written);
    a file found wrong is removed."""
    if not final.is_file():
        return False
    if verified_sha256(final) == model.sha256 and final.stat().st_size == model.size:
        return True
    log.info("checking %s (no marker of a checked file beside it)", final)
    if final.stat().st_size == model.size and file_sha256(final) == model.sha256:
        write_marker(final, model.sha256)
        return True
    log.warning("%s is not %s (wrong size or digest): removed, assembling it again", final, model.name)
    final.unlink()
    return False


def assembled_gguf(path: str) -> Path:
    """`pkg:MODEL` -> the model's checked GGUF in the cache, assembled from its part packages the first time."""
    model = part_model(path)
    final = cached_path(model)
    if final.is_file() and verified_sha256(final) == model.sha256:
        return final  # the cheap check, without the lock
    with _assembly_lock(final):
        if not _valid_cached(model, final):
            files = part_files(model)
            log.info("assembling %s from %d part packages into %s", model.name, len(files), final)
            _concatenate(model, files, final)
            write_marker(final, model.sha256)
    return final


def seed_cache(model: PartModel, gguf: Path, fix: str) -> Path:
    """Move a GGUF joined elsewhere (tools/gpu/ship_model.py) into the cache once its size and digest are checked,
    so that `pkg:MODEL` finds it -> the cached path. A wrong file is removed: one line ending in `fix`."""
    size = gguf.stat().st_size
    found = file_sha256(gguf) if size == model.size else None
    if found != model.sha256:
        gguf.unlink()
        raise _digest_error(model, "the joined file is", f"{size:,} bytes" if found is None else
                            f"sha256 {found[:16]}...", fix)
    final = cached_path(model)
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(gguf, final)
    _fsync_dir(final.parent)
    write_marker(final, model.sha256)
    return final
