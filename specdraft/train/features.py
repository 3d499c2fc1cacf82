"""Where a training batch's target features come from: `data.features` = online | offline | hybrid.

online   the frozen target runs on every batch (capture_features; a vision-language target with each row's images,
         read from the distilled folders: VisionOnlineFeatures).
offline  `distill-data` dumped the hidden states beside the dataset (specdraft.data.features); the DataLoader
         reads them with the token ids, and the module keeps only the target's LM head (the teacher) and, for
         methods that read hidden_states[0], its embedding table: no decoder layer is in memory.
hybrid   online until every row has been seen once; each online batch's features are written to
         RUN_DIR/features, and a batch whose rows are all cached is read back instead. Once the cache holds
         every row (train and validation), the target is dropped; a resumed run with a full cache never loads it.
Each source is a callable batch -> TargetFeatures with `setup(device, rank)`; the module never asks which.
"""
from __future__ import annotations

import bisect
import gc
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from specdraft.config import Recipe, TargetConfig
from specdraft.data.features import (
    FINAL,
    FeatureStore,
    claim_features_dir,
    data_digest,
    dtype_name,
    feature_names,
    features_dir,
    hidden_key,
    read_manifest,
    split_rows,
    write_feature_file,
)
from specdraft.core.errors import SpecdraftError
from specdraft.layers.compile import compile_decoder_layers, compile_enabled
from specdraft.layers.zero import gathered
from specdraft.core.types import TargetFeatures
from specdraft.methods.base import MethodSpec
from specdraft.data.images import load_image, resolve_image
from specdraft.targets.features import capture_features
from specdraft.targets.vision import vision_features
from specdraft.targets.load import is_quantized, is_weight_only_quantized, resolve_dtype
from specdraft.train.data import DistilledData, collate


def on_device_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The frozen target's dtype on `device`: float32 becomes bf16 on GPUs that have it."""
    if torch.device(device).type == "cuda" and dtype == torch.float32 and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return dtype


def feature_dtype(cfg: TargetConfig, device: torch.device) -> torch.dtype:
    """The dtype the frozen target computes its features in during training on `device`."""
    return on_device_dtype(resolve_dtype(cfg.dtype, device), device)


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """The model's floating-point parameters in `dtype`; its buffers keep theirs, as from_pretrained(dtype=...)
    leaves them. Module.to(dtype) would also round the rotary embedding's float32 `inv_freq` to bf16 and move
    every position's angle by up to 0.4% of it (at position 1000: 0.4 to 1.8 rad for Llama-family rope_theta
    1e4 to 5e5), so that the features a draft trains on online would not be those of the target it is evaluated
    and served with, nor those of the offline dump."""
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)


class OnlineFeatures:
    """The frozen target runs on every batch."""

    graph_safe = True
    """Whether a CUDA graph may capture it with the step (train.cuda_graphs): no host work per batch."""
    prefetchable = True
    """Whether it may run a batch ahead on a side CUDA stream (train.prefetch_features): it reads the batch's
    tensors and the frozen target's weights only, with no module hooks of DeepSpeed's engine."""

    def __init__(self, model: torch.nn.Module, layers: List[int], compile: str = "false"):
        """compile: train.compile (auto compiles the decoder layers on CUDA, unless quantized)."""
        self.model, self.layers, self.compile = model, list(layers), compile

    def setup(self, device: torch.device, rank: int = 0) -> None:
        quantized = is_quantized(self.model)
        if not quantized:  # bitsandbytes weights were loaded onto their GPU already
            dtype = on_device_dtype(next(self.model.parameters()).dtype, device)
            self.model.to(device=device)
            cast_parameters(self.model, dtype)
        quantized = quantized or is_weight_only_quantized(self.model)
        if compile_enabled(self.compile, device) and not (quantized and self.compile == "auto"):
            compile_decoder_layers(self.model)

    def __call__(self, batch: Dict) -> TargetFeatures:
        """The batch's rows are right-padded (train.data.collate) or packed (position_ids): no mask needed."""
        return capture_features(self.model, batch["input_ids"], None, self.layers,
                                position_ids=batch.get("position_ids"))


class VisionOnlineFeatures(OnlineFeatures):
    """A vision-language target on every batch: each row's images (names under the distilled folders) are read and
    run through its vision tower and projector, then its language model (specdraft.targets.vision)."""

    graph_safe = False  # reads each batch's images on the host
    prefetchable = True  # the images are read and processed on the host, then copied on the side stream

    def __init__(self, model: torch.nn.Module, processor, layers: List[int], distill_dirs: List[str],
                 compile: str = "false"):
        super().__init__(model, layers, compile)
        self.processor, self.distill_dirs = processor, list(distill_dirs)

    def __call__(self, batch: Dict) -> TargetFeatures:
        images = [[load_image(resolve_image(name, self.distill_dirs)) for name in row]
                  for row in batch.get("images") or [[] for _ in range(batch["input_ids"].shape[0])]]
        return vision_features(self.model, self.processor, batch["input_ids"], images, self.layers)


class ShardedOnlineFeatures(OnlineFeatures):
    """Online features from a target partitioned by ZeRO-3 (train.shard_target): the module's setup hook calls
    `build` (DeepSpeed's zero.Init: each rank keeps 1/N of every weight) and registers the target as its
    submodule, so that DeepSpeed's engine gathers each layer's weights as it runs (and prefetches the next); the
    engine's optimizer never sees them (frozen). The LM head, which the loss reads outside any forward, is
    gathered once into a whole copy on every GPU."""

    graph_safe = False  # DeepSpeed's engine gathers the weights in each forward
    prefetchable = False  # the engine's module hooks gather them on the compute stream: not from a side stream

    def __init__(self, build: Callable[[], torch.nn.Module], layers: List[int]):
        super().__init__(None, layers)
        self.build_target, self.lm_head = build, None

    def build(self) -> torch.nn.Module:
        """The partitioned target (built once), once the ranks' process group exists."""
        if self.model is None:
            self.model = self.build_target()
            self.lm_head = whole_copy(self.model.get_output_embeddings().weight)  # [V, H] on this rank's GPU
        return self.model

    def setup(self, device: torch.device, rank: int = 0) -> None:
        """Nothing to move: zero.Init put each rank's partitions on its GPU."""

    def __call__(self, batch: Dict) -> TargetFeatures:
        features = super().__call__(batch)
        features.lm_head = self.lm_head
        return features


def whole_copy(param: torch.Tensor) -> torch.Tensor:
    """A ZeRO-3 partitioned parameter gathered into a plain tensor that every rank keeps."""
    with gathered([param], modifier_rank=None):
        return param.detach().clone()


class OfflineFeatures:
    """Features read with the batch (batch["features"]: {name: [B, T, H]}); keeps the LM head [V, H] and, when
    index 0 is not stored, the embedding table [V, H] to look the embeddings up."""

    graph_safe = False  # not yet captured with a step: its batches carry the features from the host
    prefetchable = False  # nothing to run ahead: the features come with the batch

    def __init__(self, lm_head: torch.Tensor, embed_tokens: Optional[torch.Tensor], stored: List[int],
                 cfg: TargetConfig):
        self.lm_head, self.embed_tokens, self.stored, self.cfg = lm_head, embed_tokens, list(stored), cfg

    def setup(self, device: torch.device, rank: int = 0) -> None:
        dtype = feature_dtype(self.cfg, device)
        tied = self.embed_tokens is self.lm_head
        self.lm_head = self.lm_head.to(device, dtype)
        if self.embed_tokens is not None:
            self.embed_tokens = self.lm_head if tied else self.embed_tokens.to(device, dtype)

    def __call__(self, batch: Dict) -> TargetFeatures:
        stored = batch["features"]
        hidden_states = {i: stored[hidden_key(i)] for i in self.stored}  # [B, T, H] each
        if 0 not in hidden_states and self.embed_tokens is not None:
            hidden_states[0] = torch.nn.functional.embedding(batch["input_ids"], self.embed_tokens)  # [B, T, H]
        final_hidden = stored[FINAL].to(self.lm_head.dtype)  # [B, T, H]
        return TargetFeatures(hidden_states=hidden_states, final_hidden=final_hidden, lm_head=self.lm_head,
                              embed_tokens=self.embed_tokens)


class HybridFeatures:
    """Online with a write-through cache of every batch's features; reads the cache when the batch has them."""

    graph_safe = False  # writes each batch's features to disk
    prefetchable = False  # writes each batch's features to disk, and may release the target between batches

    def __init__(self, online: OnlineFeatures, offline: OfflineFeatures, store: FeatureStore, num_rows: int):
        self.online, self.offline, self.store, self.num_rows = online, offline, store, num_rows
        self.rank, self.cached_batches = 0, 0

    def setup(self, device: torch.device, rank: int = 0) -> None:
        self.rank = rank
        if self.online is not None:
            self.online.setup(device, rank)
        self.offline.setup(device, rank)

    def __call__(self, batch: Dict) -> TargetFeatures:
        if "features" in batch:
            self.cached_batches += 1
            if self.online is not None and self.cached_batches % 50 == 0:  # other ranks may have filled the cache
                self._release_when_complete()
            return self.offline(batch)
        if self.online is None:  # the target is gone: every row is cached, read them here
            return self.offline({**batch, "features": stack_features(self._cached_rows(batch), batch)})
        features = self.online(batch)
        self._write(batch, features)
        return features

    def _cached_rows(self, batch: Dict) -> List[Dict[str, torch.Tensor]]:
        self.store.refresh()
        return [self.store.read(int(row)) for row in batch["row_ids"].tolist()]

    def _write(self, batch: Dict, features: TargetFeatures) -> None:
        self.store.refresh()
        lengths = batch["attention_mask"].sum(-1).tolist()
        new = [(b, int(row)) for b, row in enumerate(batch["row_ids"].tolist()) if int(row) not in self.store]
        if new:
            rows = split_rows(features, lengths, self.offline.stored)
            name = f"cache-r{self.rank}-{uuid.uuid4().hex[:12]}.safetensors"
            write_feature_file(self.store.directory / name, [row for _, row in new], [rows[b] for b, _ in new])
        self._release_when_complete()

    def _release_when_complete(self) -> None:
        if len(self.store.refresh()) >= self.num_rows:
            self.release_target()

    def release_target(self) -> None:
        """Drop the frozen target: from here on every batch is read from the cache."""
        self.online = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def stack_features(row_features: List[Optional[Dict[str, torch.Tensor]]], batch: Dict) -> Dict[str, torch.Tensor]:
    """Per-row {name: [n, H]} -> {name: [B, T, H]} aligned with batch["input_ids"] (row b at [b, :n], cut at T)."""
    batch_size, length = batch["input_ids"].shape
    stacked = {}
    for name, first in row_features[0].items():
        out = torch.zeros(batch_size, length, first.shape[-1], dtype=first.dtype)
        for b, tensors in enumerate(row_features):
            n = min(length, tensors[name].shape[0])
            out[b, :n] = tensors[name][:n]
        stacked[name] = out.to(batch["input_ids"].device)
    return stacked


class FeatureLookup:
    """Dataset row -> its stored features, over one store per distilled set (their rows concatenated in order).
    A missing row (the hybrid cache still growing) rereads the directories at most once a second."""

    def __init__(self, stores: List[FeatureStore], starts: List[int]):
        self.stores, self.starts, self._refreshed = stores, starts, 0.0

    def get(self, row: int) -> Optional[Dict[str, torch.Tensor]]:
        k = bisect.bisect_right(self.starts, row) - 1
        store, local = self.stores[k], row - self.starts[k]
        if local not in store and time.monotonic() - self._refreshed > 1.0:
            store.refresh()
            self._refreshed = time.monotonic()
        return store.read(local) if local in store else None


class FeatureRows(torch.utils.data.Dataset):
    """The distilled dataset with each row's id and stored features (None when not stored yet)."""

    def __init__(self, dataset, lookup: FeatureLookup, row_ids: Optional[np.ndarray] = None):
        self.dataset, self.lookup = dataset, lookup
        self.row_ids = np.arange(len(dataset)) if row_ids is None else np.asarray(row_ids)

    def __len__(self) -> int:
        return len(self.row_ids)

    def __getitem__(self, index: int) -> Dict:
        row_id = int(self.row_ids[index])
        return {**self.dataset[index], "row_id": row_id, "features": self.lookup.get(row_id)}

    def select(self, indices) -> "FeatureRows":
        return FeatureRows(self.dataset.select(indices), self.lookup, self.row_ids[np.asarray(indices)])


def collate_with_features(rows: List[Dict], max_length: int, pad_to_multiple: int = 1) -> Dict:
    """`collate` plus row_ids [B] and, when every row has them, features {name: [B, T, H]}."""
    batch = collate(rows, max_length, pad_to_multiple)
    batch["row_ids"] = torch.tensor([row["row_id"] for row in rows], dtype=torch.long)
    if all(row["features"] is not None for row in rows):
        batch["features"] = stack_features([row["features"] for row in rows], batch)
    return batch


def check_offline_store(directory: Path, need: List[int], recipe: Recipe, dataset) -> dict:
    """The manifest of a complete `distill-data` feature dump that fits this recipe and dataset, or an error."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise SpecdraftError(f"no target features at {directory}; run `specdraft distill-data RECIPE "
                             f"data.features=offline` first (with this distill.output_dir)")
    if not set(need) <= set(manifest["layers"]):
        raise SpecdraftError(f"{directory} holds target layers {manifest['layers']}, the method needs {need}; "
                             f"delete {directory} and run distill-data again")
    target = recipe.target
    for key, value in (("target", target.path), ("target_revision", target.revision),
                       ("quantization", target.quantization)):
        if manifest.get(key) != value:
            raise SpecdraftError(f"{directory} features come from {key}={manifest.get(key)}, the recipe has "
                                 f"{value}; delete {directory} and run distill-data again")
    if manifest.get("data_digest") != data_digest(dataset):
        raise SpecdraftError(f"{directory} holds features of other token rows than {directory.parent}/dataset; "
                             f"delete {directory} and run distill-data again")
    return manifest


def offline_lookup(recipe: Recipe, spec: MethodSpec, info, distill_dirs: List[str]):
    """-> (FeatureLookup over every distilled set's dump, stored layers) after checking each dump."""
    from specdraft.data.format import REDO_DATASET, dataset_dir, load_rows

    need = spec.feature_layers(recipe.method, info)
    stores, starts, layers, start = [], [], None, 0
    for distill_dir in distill_dirs:
        dataset = load_rows(dataset_dir(distill_dir), "distilled dataset", REDO_DATASET)
        directory = features_dir(distill_dir)
        manifest = check_offline_store(directory, need, recipe, dataset)
        if layers is not None and manifest["layers"] != layers:
            raise SpecdraftError(f"{directory} stores layers {manifest['layers']}, another set {layers}; "
                                 f"dump every set with the same method.feature_layers")
        layers = manifest["layers"]
        store = FeatureStore(directory, feature_names(layers))
        if len(store) != len(dataset):
            raise SpecdraftError(f"{directory} holds features of {len(store)} of {len(dataset)} rows; run "
                                 f"distill-data again to finish the dump")
        stores.append(store)
        starts.append(start)
        start += len(dataset)
    return FeatureLookup(stores, starts), layers


def hybrid_manifest(recipe: Recipe, info, dataset, layers: List[int], device: torch.device) -> dict:
    target = recipe.target
    return {"layers": layers, "hidden_size": info.hidden_size, "dtype": dtype_name(feature_dtype(target, device)),
            "target": target.path, "target_revision": target.revision, "quantization": target.quantization,
            "data_digest": data_digest(dataset), "max_length": recipe.data.max_length}


class FeatureData(DistilledData):
    """DistilledData whose rows carry their stored features (offline and hybrid)."""

    def _collate(self, rows):
        return collate_with_features(rows, self.data_cfg.max_length, self.data_cfg.pad_to_multiple)


def _online(recipe: Recipe, spec: MethodSpec, device: torch.device, distill_dirs: List[str]):
    """The frozen target for online features, loaded straight onto this rank's device in the dtype it computes
    in there (bf16 on GPUs): no float32 copy in host memory (32 GB per rank for an 8B target), no copy later."""
    from specdraft.targets.load import load_target

    dtype = dtype_name(feature_dtype(recipe.target, device))
    target = load_target(recipe.target, device, dtype=dtype, quantize=True)
    layers = spec.feature_layers(recipe.method, target.info)
    if target.processor is not None:
        return target, VisionOnlineFeatures(target.model, target.processor, layers, distill_dirs,
                                            recipe.train.compile_setting())
    return target, OnlineFeatures(target.model, layers, recipe.train.compile_setting())


def check_vision_features(recipe: Recipe, shard_target: bool) -> None:
    """A vision-language target trains with online features on unpacked rows (its images run with each batch)."""
    from specdraft.targets.load import is_vision_target

    if not is_vision_target(recipe.target):
        return
    if recipe.data.features != "online" or recipe.data.pack_length or shard_target:
        raise SpecdraftError(f"target {recipe.target.path} is a vision-language model: it trains with "
                             f"data.features=online, data.pack_length=null and train.shard_target=false (got "
                             f"data.features={recipe.data.features}, data.pack_length={recipe.data.pack_length}, "
                             f"train.shard_target={recipe.train.shard_target})")


def _sharded_online(recipe: Recipe, spec: MethodSpec, device: torch.device):
    """Online features from a target that the module's setup hook builds partitioned (ZeRO-3, shard_target)."""
    from specdraft.targets.load import load_sharded_target, load_target_info

    info = load_target_info(recipe.target)
    dtype = feature_dtype(recipe.target, device)
    source = ShardedOnlineFeatures(lambda: load_sharded_target(recipe.target, dtype),
                                   spec.feature_layers(recipe.method, info))
    return source, info


def _hybrid(recipe: Recipe, spec: MethodSpec, dataset, device: torch.device):
    from specdraft.targets.features import layers_to_store
    from specdraft.targets.heads import load_target_heads
    from specdraft.targets.load import load_target_info

    info = load_target_info(recipe.target)
    directory = Path(recipe.train.output_dir) / "features"
    found = read_manifest(directory) if any(directory.glob("*.safetensors")) else None
    layers = found["layers"] if found else None
    need = spec.feature_layers(recipe.method, info)
    if layers is not None and not set(need) <= set(layers):
        raise SpecdraftError(f"{directory} caches target layers {layers}, the method needs {need}; delete {directory}")
    store = FeatureStore(directory, feature_names(layers or []))
    if layers is not None and len(store) >= len(dataset):  # every row cached: no target this time
        claim_features_dir(directory, hybrid_manifest(recipe, info, dataset, layers, device))
        heads = load_target_heads(recipe.target, spec.reads_embeddings and 0 not in layers)
        offline = OfflineFeatures(heads.lm_head, heads.embed_tokens, layers, recipe.target)
        return HybridFeatures(None, offline, store, len(dataset)), store, info
    target, online = _online(recipe, spec, device, [])
    layers = layers or layers_to_store(spec, recipe.method, info, target.model)
    claim_features_dir(directory, hybrid_manifest(recipe, info, dataset, layers, device))
    store = FeatureStore(directory, feature_names(layers))
    embed = target.model.get_input_embeddings().weight if spec.reads_embeddings and 0 not in layers else None
    offline = OfflineFeatures(target.model.get_output_embeddings().weight, embed, layers, recipe.target)
    return HybridFeatures(online, offline, store, len(dataset)), store, target.info


def build_features(recipe: Recipe, spec: MethodSpec, dataset, distill_dirs: List[str], device: torch.device,
                   shard_target: bool = False):
    """-> (feature source, the dataset the DataLoader reads, TargetInfo, DataModule class) for data.features.
    `shard_target` (online only): the target is built later, partitioned, by the module's setup hook."""
    from specdraft.targets.heads import load_target_heads
    from specdraft.targets.load import load_target_info

    mode = recipe.data.features
    check_vision_features(recipe, shard_target)
    if mode == "online" and shard_target:
        source, info = _sharded_online(recipe, spec, device)
        return source, dataset, info, DistilledData
    if mode == "online":
        target, online = _online(recipe, spec, device, distill_dirs)
        return online, dataset, target.info, DistilledData
    if mode == "offline":
        lookup, layers = offline_lookup(recipe, spec, load_target_info(recipe.target), distill_dirs)
        heads = load_target_heads(recipe.target, spec.reads_embeddings and 0 not in layers)
        offline = OfflineFeatures(heads.lm_head, heads.embed_tokens, layers, recipe.target)
        return offline, FeatureRows(dataset, lookup), heads.info, FeatureData
    source, store, info = _hybrid(recipe, spec, dataset, device)
    return source, FeatureRows(dataset, FeatureLookup([store], [0])), info, FeatureData
