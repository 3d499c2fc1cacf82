"""Weights written as safetensors files with the permissions of every other file a stage writes: safetensors
writes its files 0600 whatever the umask, which leaves an export or a draft snapshot unreadable to the user or
service that serves it, beside a config.json anyone may read."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

import torch
from safetensors.torch import save_file


def umask() -> int:
    """The process's umask: read from /proc where Linux has it (setting it to read it races other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_tensors(tensors: Dict[str, torch.Tensor], path: str | Path, metadata: Optional[Dict[str, str]] = None) -> None:
    """safetensors' save_file, the file then given the mode a plain open() would give it (0644 under umask 022)."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~umask())
