"""`distill-data` with `data.features=offline`: dump the target's hidden states of every distilled row (of
distill.output_dir and of each set in train.extra_distilled).

Runs after the text shards are merged into dataset/. Rows [k*S, (k+1)*S) (S = distill.shard_size) go through the
frozen target (with target.quantization) in batches of distill.batch_size rows, and shard k is written as one
file, features/shard-0000k.safetensors, atomically (specdraft.data.features has the layout). An interrupted
run keeps whole shards; re-running the same command computes just the missing ones, and a run that finds them
all loads no target. The manifest guards the directory: features of other rows, layers, dtype or target are
refused. What is stored: the hidden states the method reads (`MethodSpec.feature_layers`) and the final normed
hidden state; index 0 (token embeddings) only where the target's embedding table does not reproduce it.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from specdraft.config import Recipe
from specdraft.data.features import (
    claim_features_dir,
    data_digest,
    dtype_name,
    features_dir,
    read_manifest,
    split_rows,
    write_feature_file,
)
from specdraft.data.format import REDO_DATASET, dataset_dir, load_rows
from specdraft.core.errors import SpecdraftError
from specdraft.core.io import TMP_PREFIX
from specdraft.methods import get_method

log = logging.getLogger(__name__)


def shard_file(directory: Path, shard_index: int) -> Path:
    return directory / f"shard-{shard_index:05d}.safetensors"


def right_pad(rows: List[np.ndarray]) -> tuple:
    """Token rows -> input_ids [B, T], attention_mask [B, T] (right padding with id 0)."""
    width = max(len(ids) for ids in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, ids in enumerate(rows):
        input_ids[b, :len(ids)] = torch.as_tensor(np.asarray(ids, dtype=np.int64))
        attention_mask[b, :len(ids)] = 1
    return input_ids, attention_mask


def shard_features(model, rows: List[np.ndarray], layers: List[int], batch_size: int,
                   device) -> List[Dict[str, torch.Tensor]]:
    """Features of one shard's rows, in row order; batches are length-sorted to pad little."""
    from specdraft.targets.features import capture_features

    order = sorted(range(len(rows)), key=lambda k: -len(rows[k]))
    out: List[Optional[dict]] = [None] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        input_ids, _ = right_pad([rows[k] for k in chunk])  # [B, T]
        features = capture_features(model, input_ids.to(device), None, layers)  # right-padded: causal alone
        for k, tensors in zip(chunk, split_rows(features, [len(rows[k]) for k in chunk], layers)):
            out[k] = {name: tensor.cpu() for name, tensor in tensors.items()}
    return out


def _reusable_layers(directory: Path, recipe: Recipe, info) -> Optional[List[int]]:
    """The layers an existing features dir holds if they cover the method's; None for a new dir."""
    found = read_manifest(directory)
    if found is None or not any(directory.glob("*.safetensors")):
        return None
    need = get_method(recipe.method_name).feature_layers(recipe.method, info)
    if not set(need) <= set(found["layers"]):
        raise SpecdraftError(f"{directory} holds target layers {found['layers']} but method.feature_layers needs "
                             f"{need}; delete {directory} to dump them again")
    return list(found["layers"])


def expected_manifest(recipe: Recipe, info, dtype: torch.dtype, digest: str, layers: List[int]) -> dict:
    target = recipe.target
    return {"layers": layers, "hidden_size": info.hidden_size, "dtype": dtype_name(dtype), "target": target.path,
            "target_revision": target.revision, "quantization": target.quantization, "data_digest": digest,
            "max_length": None}


def write_shards(model, dataset, directory: Path, pending: List[int], layers: List[int], recipe: Recipe,
                 device) -> int:
    """Compute and write the features of the `pending` shards; -> tokens written."""
    from tqdm.auto import tqdm

    size, tokens = recipe.distill.shard_size, 0
    for k in tqdm(pending, unit="shard", desc="features"):
        indices = list(range(k * size, min((k + 1) * size, len(dataset))))
        rows = [dataset[i]["input_ids"] for i in indices]
        write_feature_file(shard_file(directory, k), indices,
                           shard_features(model, rows, layers, recipe.distill.batch_size, device))
        tokens += sum(len(ids) for ids in rows)
    return tokens


def dump_features(recipe: Recipe, out: Path, device: Optional[str] = None, loaded: Optional[dict] = None) -> dict:
    """Dump the features of every row of `out`/dataset into `out`/features; -> rows, tokens, bytes, seconds.
    `loaded` keeps the target between calls (it is loaded only when a shard is missing)."""
    from specdraft.targets.features import layers_to_store
    from specdraft.targets.load import load_target, load_target_info, resolve_dtype

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dataset = load_rows(dataset_dir(out), "distilled dataset", REDO_DATASET).with_format("numpy")
    directory, size = features_dir(out), recipe.distill.shard_size
    info = load_target_info(recipe.target)
    layers = _reusable_layers(directory, recipe, info)
    digest = data_digest(dataset)
    dtype = resolve_dtype(recipe.target.dtype, device)
    if layers is not None:  # a dir made for other rows or another target fails here, before any loading
        claim_features_dir(directory, expected_manifest(recipe, info, dtype, digest, layers))
    pending = [k for k in range(-(-len(dataset) // size)) if not shard_file(directory, k).is_file()]
    started, tokens = time.perf_counter(), 0
    for stale in directory.glob(TMP_PREFIX + "*"):  # files of an interrupted run
        stale.unlink()
    if pending:
        loaded = {} if loaded is None else loaded
        if "target" not in loaded:
            loaded["target"] = load_target(recipe.target, device, require_chat_template=False, quantize=True)
        target = loaded["target"]
        layers = layers or layers_to_store(get_method(recipe.method_name), recipe.method, info, target.model)
        claim_features_dir(directory, expected_manifest(recipe, info, dtype, digest, layers))
        log.info("dumping target features (layers %s) of %d shards into %s", layers, len(pending), directory)
        tokens = write_shards(target.model, dataset, directory, pending, layers, recipe, device)
    seconds = time.perf_counter() - started
    summary = {"features_dir": str(directory), "layers": layers, "rows": len(dataset), "shards_written": len(pending),
               "tokens_written": tokens, "bytes": sum(p.stat().st_size for p in directory.glob("*.safetensors")),
               "seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9)}
    print(f"target features: {summary['rows']} rows, layers {layers} + final hidden, "
          f"{summary['bytes'] / 2**30:.2f} GiB -> {directory}", file=sys.stderr)
    return summary



def dump_all_features(recipe: Recipe, out: Path, device: Optional[str] = None) -> List[dict]:
    """Dump the features of `out` and of every set in train.extra_distilled (offline training reads them all)."""
    loaded: dict = {}
    return [dump_features(recipe, Path(directory).expanduser(), device, loaded)
            for directory in [out, *recipe.train.extra_distilled]]
