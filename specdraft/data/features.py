"""Target features on disk, so that training can run with no target layers in memory.

FEATURES_DIR/      DISTILL_DIR/features (written by `distill-data`), or RUN_DIR/features (the hybrid cache)
  manifest.json    what the files hold (MANIFEST_KEYS): stored layers, hidden size, dtype, target, data digest
  *.safetensors    each a set of dataset rows, written atomically (temp name + rename):
                     rows [R] int64        dataset row ids
                     offsets [R + 1] int64 row rows[k] is tokens offsets[k]:offsets[k + 1] of every tensor below
                     hidden.{i} [N, H]     input of target decoder layer i (0: token embeddings), for each stored i
                     final_hidden [N, H]   the last hidden state after the final norm
No logits: training recomputes the teacher from final_hidden and the target's LM head. Tensors keep the
target's dtype (bf16 on GPUs). Files whose names start with TMP_PREFIX are unfinished and never read.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdraft.core.errors import SpecdraftError
from specdraft.core.io import TMP_PREFIX, reading
from specdraft.core.types import TargetFeatures

MANIFEST = "manifest.json"
FINAL = "final_hidden"
MANIFEST_KEYS = ("layers", "hidden_size", "dtype", "target", "target_revision", "quantization", "data_digest",
                 "max_length")
"""Two feature sets are interchangeable when these agree (`max_length` is set where rows were cut)."""


def features_dir(distill_dir: str | Path) -> Path:
    return Path(distill_dir) / "features"


def hidden_key(layer: int) -> str:
    return f"hidden.{layer}"


def data_digest(dataset) -> str:
    """sha256 of every row's input_ids (with its length): which token rows the features belong to."""
    digest = hashlib.sha256()
    for batch in dataset.select_columns(["input_ids"]).with_format("numpy").iter(batch_size=1024):
        for ids in batch["input_ids"]:
            digest.update(np.int64(len(ids)).tobytes())
            digest.update(np.asarray(ids, dtype=np.int32).tobytes())
    return digest.hexdigest()


REDO_FEATURES = "delete {path} and run the same command again: it recomputes the features files that are missing"
"""How to write a corrupt features file (or manifest) again."""


def read_manifest(directory: Path) -> Optional[dict]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    with reading(path, "features manifest", REDO_FEATURES.format(path=directory)):
        return json.loads(path.read_text())


def claim_features_dir(directory: Path, expected: dict) -> None:
    """Write the manifest into a new features dir, or check that an existing one holds the same features."""
    directory = Path(directory)
    found = read_manifest(directory)
    if found is not None and any(directory.glob("*.safetensors")):
        changed = [key for key in MANIFEST_KEYS if found.get(key) != expected.get(key)]
        if changed:
            raise SpecdraftError(f"{directory} holds target features with a different {', '.join(changed)} "
                                 f"({', '.join(f'{k}={found.get(k)}' for k in changed)}); delete {directory}")
    manifest = {key: expected.get(key) for key in MANIFEST_KEYS}
    if found != manifest:  # several ranks may claim a hybrid cache at once: unique temp names, same content
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f"{TMP_PREFIX}{MANIFEST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, directory / MANIFEST)


def write_feature_file(path: Path, rows: List[int], row_tensors: List[Dict[str, torch.Tensor]]) -> Path:
    """Concatenate each row's {name: [n, H]} along tokens and write them as one file, atomically."""
    lengths = [next(iter(tensors.values())).shape[0] for tensors in row_tensors]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)  # [R + 1]
    tensors = {name: torch.cat([t[name].detach().cpu() for t in row_tensors]).contiguous()  # [N, H]
               for name in row_tensors[0]}
    tensors.update(rows=torch.tensor(rows, dtype=torch.int64), offsets=offsets)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return path


class FeatureStore:
    """The rows of one features directory, read lazily from memory-mapped files; picklable (DataLoader workers
    reopen the files). `refresh()` picks up files written since (the hybrid cache grows while training)."""

    def __init__(self, directory: str | Path, names: Iterable[str]):
        self.directory, self.names = Path(directory), list(names)
        self._index: Dict[int, tuple] = {}  # row -> (file name, first token, end token)
        self._files: set = set()
        self._handles: Dict[str, object] = {}
        self.refresh()

    def __getstate__(self):
        return {**self.__dict__, "_handles": {}}

    def refresh(self) -> "FeatureStore":
        if not self.directory.is_dir():
            return self
        for path in sorted(self.directory.glob("*.safetensors")):
            if path.name.startswith(TMP_PREFIX) or path.name in self._files:
                continue
            rows, offsets = self._file_rows(path)
            for k, row in enumerate(rows):
                self._index[row] = (path.name, offsets[k], offsets[k + 1])
            self._files.add(path.name)
        return self

    def _file_rows(self, path: Path) -> tuple:
        """(rows, offsets) of one features file, checked: every tensor it must hold covers the offsets' tokens."""
        with reading(path, "features file", REDO_FEATURES.format(path=path)), \
                safe_open(str(path), framework="pt") as handle:
            rows, offsets = handle.get_tensor("rows").tolist(), handle.get_tensor("offsets").tolist()
            for name in self.names:
                tokens = handle.get_slice(name).get_shape()[0]
                if len(offsets) != len(rows) + 1 or tokens != offsets[-1]:
                    raise ValueError(f"tensor {name} holds {tokens} tokens; its offsets say {offsets[-1:]}")
        return rows, offsets

    def __contains__(self, row: int) -> bool:
        return row in self._index

    def __len__(self) -> int:
        return len(self._index)

    def read(self, row: int) -> Dict[str, torch.Tensor]:
        """{name: [n, H]} of one row, for each of `names`."""
        name, start, end = self._index[row]
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = safe_open(str(self.directory / name), framework="pt")
        return {key: handle.get_slice(key)[start:end] for key in self.names}


def split_rows(features: TargetFeatures, lengths: List[int], layers: List[int]) -> List[Dict[str, torch.Tensor]]:
    """Batch features [B, T, H] -> per row {hidden.i: [n, H], final_hidden: [n, H]}, padding dropped."""
    return [{**{hidden_key(i): features.hidden_states[i][b, :n] for i in layers},
             FINAL: features.final_hidden[b, :n]} for b, n in enumerate(lengths)]


def feature_names(layers: Iterable[int]) -> List[str]:
    return [hidden_key(i) for i in sorted(layers)] + [FINAL]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
