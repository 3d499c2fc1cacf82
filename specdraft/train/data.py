"""The distilled dataset as training batches: split, answer-token counts, collation, resumable sampling."""
from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Tuple

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from specdraft.config import DataConfig, TrainConfig
from specdraft.data.format import REDO_DATASET, dataset_dir, load_rows
from specdraft.core.errors import SpecdraftError


def load_distilled(distill_dirs: List[str], all_columns: bool = False):
    """One or more `distill-data` outputs as one dataset of input_ids and loss_mask, and the rows' images when
    a vision-language target distilled them (every column of a method's own records with `all_columns`)."""
    from datasets import concatenate_datasets

    parts = []
    for distill_dir in distill_dirs:
        path = dataset_dir(distill_dir)
        if not path.is_dir():
            raise SpecdraftError(f"no distilled dataset at {path}; run `specdraft distill-data RECIPE` first")
        part = load_rows(path, "distilled dataset", REDO_DATASET)
        columns = ["input_ids", "loss_mask", *(["images"] if "images" in part.column_names else [])]
        parts.append(part if all_columns else part.select_columns(columns))
    dataset = concatenate_datasets(parts).with_format("numpy")
    if len(dataset) < 2:
        raise SpecdraftError(f"distilled data {', '.join(distill_dirs)} has {len(dataset)} rows; need at least 2")
    return dataset


def split_indices(num_rows: int, val_fraction: float, seed: int, groups=None):
    """Deterministic train/val split -> (train indices, val indices); val has at least one row. groups [N] (ids
    0..G-1 in order of first appearance, `prompt_groups`): a group's rows fall on one side. Without groups, or
    with one row a group, the split is the same."""
    groups = np.arange(num_rows) if groups is None else np.asarray(groups)
    num_groups = int(groups.max()) + 1 if num_rows else 0
    order = np.random.default_rng(seed).permutation(num_groups)
    num_val = min(num_rows - 1, max(1, round(num_rows * val_fraction)))
    rows_taken = np.cumsum(np.bincount(groups, minlength=num_groups)[order])  # [G] rows in the first g groups
    is_val = np.isin(groups, order[:np.searchsorted(rows_taken, num_val) + 1])
    if is_val.all():  # one group holds (nearly) every row: split its rows instead
        return split_indices(num_rows, val_fraction, seed)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def prompt_groups(dataset):
    """[N] ids of the prompt each row answers (its `source` and `index`), in order of first appearance, or None
    when the rows lack them: two distilled sets of the same prompts (greedy and sampled answers) then never put
    one prompt on both sides of the split."""
    if not {"source", "index"} <= set(dataset.column_names):
        return None
    keys = np.array([f"{source}\0{index}" for source, index in zip(dataset["source"], dataset["index"])])
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse]


def load_prompt_groups(distill_dirs: List[str]):
    """`prompt_groups` of the rows `load_distilled(distill_dirs)` returns, or None if a set lacks prompt ids."""
    from datasets import concatenate_datasets

    parts = [load_rows(dataset_dir(distill_dir), "distilled dataset", REDO_DATASET) for distill_dir in distill_dirs]
    if not all({"source", "index"} <= set(part.column_names) for part in parts):
        return None
    return prompt_groups(concatenate_datasets([part.select_columns(["source", "index"]) for part in parts]))


def split_distilled(distill_dirs: List[str], num_rows: int, val_fraction: float, seed: int):
    """`split_indices` of `load_distilled(distill_dirs)`'s rows, a prompt's rows on one side -> (train, val)."""
    return split_indices(num_rows, val_fraction, seed, load_prompt_groups(distill_dirs))


def answer_token_counts(dataset, indices, vocab_size: int) -> torch.Tensor:
    """[V] how often each token id is an answer token (loss_mask 1) in the given rows."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for row in dataset.select(indices).iter(batch_size=256):
        ids = np.concatenate(row["input_ids"]) if len(row["input_ids"]) else np.zeros(0, np.int64)
        mask = np.concatenate(row["loss_mask"]).astype(bool) if len(row["loss_mask"]) else ids.astype(bool)
        counts += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return torch.from_numpy(counts)


def collate(rows: List[Dict[str, np.ndarray]], max_length: int, pad_to_multiple: int = 1) -> Dict[str, torch.Tensor]:
    """Right-pad to the longest row rounded up to a multiple of pad_to_multiple (cut at max_length) ->
    input_ids, loss_mask, attention_mask [B, T]; and `images`, each row's image names, when the rows have them."""
    longest = max(len(r["input_ids"]) for r in rows)
    length = min(max_length, -(-longest // pad_to_multiple) * pad_to_multiple)
    input_ids = torch.zeros(len(rows), length, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), length, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(rows):
        n = min(length, len(row["input_ids"]))
        input_ids[b, :n] = torch.as_tensor(row["input_ids"][:n].astype(np.int64))
        loss_mask[b, :n] = torch.as_tensor(row["loss_mask"][:n].astype(np.int64))
        attention_mask[b, :n] = 1
    batch = {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": attention_mask}
    if "images" in rows[0]:
        batch["images"] = [[str(name) for name in row["images"]] for row in rows]
    return batch


def pack_rows(lengths: List[int], pack_length: int) -> List[List[int]]:
    """First-fit decreasing: which conversations (indices into `lengths`) share each row of pack_length tokens."""
    rows: List[List[int]] = []
    room: List[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        row = next((r for r, free in enumerate(room) if lengths[index] <= free), None)
        if row is None:
            rows.append([])
            room.append(pack_length)
            row = len(rows) - 1
        rows[row].append(index)
        room[row] -= lengths[index]
    return [sorted(row) for row in rows]


def collate_packed(rows: List[Dict[str, np.ndarray]], max_length: int, pack_length: int) -> Dict[str, torch.Tensor]:
    """Pack conversations (each cut at max_length) into rows of exactly pack_length tokens -> input_ids, loss_mask,
    attention_mask, position_ids (restarting at each conversation), document_ids (0, 1, ... per row) [R, pack_length].

    The padding at a row's end is one more document (positions from 0), so no real token attends to it."""
    lengths = [min(max_length, len(r["input_ids"])) for r in rows]
    packed = pack_rows(lengths, pack_length)
    out = {name: torch.zeros(len(packed), pack_length, dtype=torch.long)
           for name in ("input_ids", "loss_mask", "attention_mask", "position_ids", "document_ids")}
    for r, members in enumerate(packed):
        start = 0
        for document, index in enumerate(members):
            n, cols = lengths[index], slice(start, start + lengths[index])
            out["input_ids"][r, cols] = torch.as_tensor(rows[index]["input_ids"][:n].astype(np.int64))
            out["loss_mask"][r, cols] = torch.as_tensor(rows[index]["loss_mask"][:n].astype(np.int64))
            out["attention_mask"][r, cols] = 1
            out["position_ids"][r, cols] = torch.arange(n)
            out["document_ids"][r, cols] = document
            start += n
        out["position_ids"][r, start:] = torch.arange(pack_length - start)
        out["document_ids"][r, start:] = len(members)
    return out


class ResumableSampler(Sampler[int]):
    """Endless epoch-seeded shuffles of the training rows, dealt to the ranks round-robin, from a global position.

    Epoch e is a permutation of the rows (seed + e) cut to a multiple of the world size; the global sample
    positions run through the epochs one after the other, and rank r of `world` reads positions
    start + r, start + r + world, ... So a run resumed at global position `start` reads exactly the samples an
    uninterrupted run would have read next, on the same number of ranks; on another number it reads the rest of
    the same stream, dealt among its own ranks. `total` is the samples per rank of the whole run (len), `done`
    how many of them this rank had read before (start.. yields total - done).
    """

    def __init__(self, indices: np.ndarray, seed: int, total: int, start: Callable[[], Tuple[int, int]],
                 rank: Callable[[], int], world: Callable[[], int]):
        self.indices, self.seed, self.total = indices, seed, total
        self.start, self.rank, self.world = start, rank, world

    def __len__(self) -> int:
        return self.total

    def __iter__(self):
        rank, world = self.rank(), self.world()
        per_epoch = len(self.indices) // world * world
        if per_epoch == 0:
            raise SpecdraftError(f"{len(self.indices)} training rows cannot feed {world} ranks")
        start, done = self.start()
        order, order_epoch = None, None
        for read in range(self.total - done):
            epoch, offset = divmod(start + read * world + rank, per_epoch)
            if epoch != order_epoch:
                order, order_epoch = np.random.default_rng(self.seed + epoch).permutation(len(self.indices)), epoch
            yield int(self.indices[order[offset]])


BatchStream = Callable[[Iterator[Dict]], Iterator[Dict]]
"""What a training loader's batches pass through on their way to the trainer (FeaturePrefetch.track)."""


class ResumableLoader(DataLoader):
    """The training loader. It resumes exactly by itself: its ResumableSampler starts at the global position the
    data module restored. Its own state is empty; having one is how Lightning knows it is resumable (else it
    warns, at every mid-epoch resume, that the loader is not). `batch_stream`: what its batches pass through
    (train.prefetch_features numbers them and reads one ahead), or None."""

    def __init__(self, *args, batch_stream: Optional[BatchStream] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_stream = batch_stream

    def __iter__(self):
        batches = super().__iter__()
        return batches if self.batch_stream is None else self.batch_stream(batches)

    def state_dict(self) -> Dict[str, int]:
        return {}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Nothing to restore: the data module's state holds the position."""


class DistilledData(L.LightningDataModule):
    """Train and validation loaders; its state (saved in every checkpoint) is the global sample position."""

    def __init__(self, dataset, data_cfg: DataConfig, train_cfg: TrainConfig, train_idx, val_idx):
        super().__init__()
        self.dataset, self.data_cfg, self.train_cfg = dataset, data_cfg, train_cfg
        self.train_idx, self.val_idx = train_idx, val_idx
        self.resumed_position, self.resumed_step = 0, 0
        self.batch_stream: Optional[BatchStream] = None
        """What the training batches pass through (DraftModule.batch_stream: train.prefetch_features); None: as
        collated. Validation batches never do."""

    def _collate(self, rows):
        if self.data_cfg.pack_length:
            return collate_packed(rows, self.data_cfg.max_length, self.data_cfg.pack_length)
        return collate(rows, self.data_cfg.max_length, self.data_cfg.pad_to_multiple)

    def _samples_per_step(self) -> int:
        """Samples one rank reads per optimizer step."""
        return self.train_cfg.accumulate_grad_batches * self.train_cfg.micro_batch_size

    def global_position(self) -> int:
        """Samples all ranks together have read up to the current step (world sizes may differ across resumes)."""
        steps = self.trainer.global_step - self.resumed_step
        return self.resumed_position + steps * self._samples_per_step() * self.trainer.world_size

    def state_dict(self) -> Dict[str, int]:
        return {"global_position": self.global_position(), "step": self.trainer.global_step}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.resumed_position, self.resumed_step = state["global_position"], state["step"]

    def _start(self) -> Tuple[int, int]:
        return self.global_position(), self.trainer.global_step * self._samples_per_step()

    def train_dataloader(self):
        cfg = self.train_cfg
        sampler = ResumableSampler(self.train_idx, cfg.seed, cfg.max_steps * self._samples_per_step(), self._start,
                                   lambda: self.trainer.global_rank, lambda: self.trainer.world_size)
        return ResumableLoader(self.dataset, batch_size=cfg.micro_batch_size, sampler=sampler,
                               collate_fn=self._collate, batch_stream=self.batch_stream, **self._loader_options())

    def val_dataloader(self):
        subset = self.dataset.select(self.val_idx)
        return DataLoader(subset, batch_size=self.train_cfg.micro_batch_size, shuffle=False,
                          collate_fn=self._collate, **self._loader_options())

    def _loader_options(self) -> Dict:
        """Workers kept alive across validations (no re-spawn each time); pinned batches on GPUs, so that the
        copy to the device does not wait for the host; a generator of the loader's own, so that starting an
        iterator (which draws its workers' base seed) leaves the global torch RNG alone: a resumed run starts one
        where the uninterrupted run did not, and must draw the same random numbers as it."""
        workers = self.train_cfg.num_workers
        return {"num_workers": workers, "persistent_workers": workers > 0, "pin_memory": torch.cuda.is_available(),
                "generator": torch.Generator().manual_seed(self.train_cfg.seed)}


class RecordData(DistilledData):
    """A method's own records (MethodSpec.records), batched by its collate."""

    def __init__(self, dataset, data_cfg: DataConfig, train_cfg: TrainConfig, train_idx, val_idx, collate):
        super().__init__(dataset, data_cfg, train_cfg, train_idx, val_idx)
        self.collate = collate

    def _collate(self, rows):
        return self.collate(rows)
