"""Checkpoints specdraft reads itself load with `torch.load(weights_only=True)` (`check_checkpoint_file` checks a
Lightning checkpoint before the run writes anything); DeepSpeed's own format cannot.

DeepSpeed's checkpoint directories (`*model_states.pt`, `*optim_states.pt`, the universal copy) are read with
`torch.load(weights_only=False)` by DeepSpeed itself (and by `resharding.zero_layout`), which runs whatever a
crafted file asks. So a DeepSpeed checkpoint is resumed only when it is one that this user's runs wrote: at every
save, rank 0 writes CHECKPOINT/specdraft-manifest.json, the SHA-256 of every file in the directory, signed with
HMAC-SHA256 under a key that only this user can read (KEY_ENV, default ~/.config/specdraft/checkpoint.key, made
at the first save, mode 0600). Before anything in the directory is unpickled, the manifest's signature and every
file's hash are checked; a directory that fails (another user's, a download, a file changed or added since the
save) is refused unless the command line says `--trust-checkpoint`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import pickle
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Optional

from specdraft.core.errors import SpecdraftError, error_summary
from specdraft.core.io import TMP_PREFIX, file_sha256, write_text

log = logging.getLogger(__name__)

MANIFEST = "specdraft-manifest.json"
KEY_ENV = "SPECDRAFT_CHECKPOINT_KEY"
"""Environment variable naming the signing key's file (default ~/.config/specdraft/checkpoint.key). The nodes of
a multi-node job need the same file (a shared home directory gives it to them)."""
TRUST_FLAG = "--trust-checkpoint"


def key_path() -> Path:
    default = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "specdraft" / "checkpoint.key"
    return Path(os.environ.get(KEY_ENV) or default).expanduser()


def _signing_key(create: bool) -> Optional[bytes]:
    """This user's key (32 random bytes); made, readable by the user alone, when `create` and there is none."""
    path = key_path()
    if not path.is_file() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first
            pass
        else:
            with os.fdopen(handle, "wb") as out:
                out.write(secrets.token_bytes(32))
    return path.read_bytes() if path.is_file() else None


def _checkpoint_files(checkpoint: Path) -> list:
    """Every file DeepSpeed or specdraft may read in the directory (temporaries and the manifest left out)."""
    return sorted(path for path in checkpoint.rglob("*") if path.is_file() and path.name != MANIFEST
                  and not any(part.startswith(TMP_PREFIX) for part in path.relative_to(checkpoint).parts))


def file_digests(checkpoint: Path, workers: int = 8) -> Dict[str, str]:
    """{relative path: SHA-256} of the checkpoint's files, hashed in parallel (hashlib releases the GIL)."""
    files = _checkpoint_files(checkpoint)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(file_sha256, files))
    return {path.relative_to(checkpoint).as_posix(): digest for path, digest in zip(files, digests)}


def _signature(key: bytes, files: Dict[str, str]) -> str:
    return hmac.new(key, json.dumps(files, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def sign_checkpoint(checkpoint: str | Path) -> None:
    """Write the signed manifest of a checkpoint directory just saved (rank 0, after every rank's files are
    written). A key that cannot be made is a warning: the run goes on, and resuming it will need the flag."""
    checkpoint = Path(checkpoint)
    try:
        key = _signing_key(create=True)
    except OSError as err:
        log.warning("cannot make the checkpoint signing key %s (%s): resuming %s will need %s", key_path(),
                    err.strerror, checkpoint, TRUST_FLAG)
        return
    files = file_digests(checkpoint)
    write_text(checkpoint / MANIFEST, json.dumps({"files": files, "hmac": _signature(key, files)}, indent=1))


def manifest_problem(checkpoint: str | Path) -> Optional[str]:
    """Why the checkpoint directory is not one this user's runs signed (None when it is): no manifest, a bad
    signature, or a file added, missing or changed since the save."""
    checkpoint, key = Path(checkpoint), _signing_key(create=False)
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        files, signature = dict(manifest["files"]), str(manifest["hmac"])
    except FileNotFoundError:
        return f"it has no {MANIFEST}"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its {MANIFEST} is unreadable ({type(err).__name__})"
    if key is None or not hmac.compare_digest(_signature(key, files), signature):
        return f"its {MANIFEST} is not signed with this user's key ({key_path()})"
    found = file_digests(checkpoint)
    changed = sorted(name for name in set(files) | set(found) if files.get(name) != found.get(name))
    return f"{changed[0]} was added, removed or changed since it was saved" if changed else None


def refusal(checkpoint: str | Path, trust: bool) -> Optional[str]:
    """Why a DeepSpeed checkpoint may not be resumed, as the error's one line (None when it may): this user's runs
    did not sign it and `trust` (the command line's flag) is off."""
    if trust:
        log.warning("%s: the files of %s will be unpickled without checking who wrote them", TRUST_FLAG, checkpoint)
        return None
    problem = manifest_problem(checkpoint)
    if problem is None:
        return None
    return (f"refusing to resume DeepSpeed checkpoint {checkpoint}: {problem}. DeepSpeed unpickles its files, which "
            f"can run code; pass {TRUST_FLAG} only if you trust where it came from")


def check_checkpoint_file(path: str | Path) -> dict:
    """A Lightning checkpoint file read as `torch.load(weights_only=True)` reads it, memory-mapped (no tensor data
    is read) -> what it holds: a truncated file, or one holding Python objects beyond weights (a pickle that would
    run code), is one line before the run writes anything."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        raise SpecdraftError(f"refusing checkpoint {path}: it holds Python objects beyond weights "
                             f"({error_summary(err, prefer='GLOBAL')}); specdraft loads checkpoints with "
                             f"weights_only=True and never runs what they hold") from None
    except Exception as err:  # noqa: BLE001 (torch raises RuntimeError, OSError, EOFError, ... for a bad file)
        raise SpecdraftError(f"corrupt checkpoint {path}: {error_summary(err)}; resume from another one "
                             f"(train.resume=PATH) or delete it to start over") from None
    if not isinstance(state, dict):
        raise SpecdraftError(f"corrupt checkpoint {path}: it holds a {type(state).__name__}, not a Lightning "
                             f"checkpoint; resume from another one (train.resume=PATH) or delete it to start over")
    return state
