"""Shards on disk: written atomically by the worker that owns them, merged once all of them exist.

Every worker that finishes its shards looks for the others; the one that finds them all merges (dataset/,
counts.json, errors.jsonl, throughput.json) under an exclusive file lock (`.merge.lock`, released by the kernel
if the process dies, so it never goes stale). `merged.json` records which shard writes the merge read: a
merge that would read the same ones again is skipped, so workers finishing in any order, re-runs and
`specdraft distill-data RECIPE --merge` all end with one merge of the current shards.
"""
from __future__ import annotations

import fcntl
import json
import logging
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from specdraft.core.errors import SpecdraftError
from specdraft.core.io import TMP_PREFIX, atomic_dir, reading, write_json
from specdraft.data.format import ROW_FEATURES, counts_path, dataset_dir, load_rows, read_counts, shards_dir

log = logging.getLogger(__name__)

ERRORS = "errors.jsonl"
CUT = "cut.jsonl"
"""distill.engine=server: the answers the server cut at a length limit (source, index, turn, tokens, reason)."""
SHARD_COUNTS = "counts.json"
MERGED = "merged.json"
THROUGHPUT = "throughput.json"
MERGE_LOCK = ".merge.lock"
COUNT_KEYS = ("input", "ok", "error", "skipped")
REDO_SHARD = "delete {path} and run `specdraft distill-data` with the same recipe again: it rewrites that shard alone"
"""How to write a shard again (the error for a corrupt one ends with it)."""


def shard_path(out: Path, shard_index: int) -> Path:
    return shards_dir(out) / f"shard-{shard_index:05d}"


def missing_shards(out: Path, num_shards: int) -> List[int]:
    return [i for i in range(num_shards) if not shard_path(out, i).is_dir()]


def remove_stale_temps(out: Path, shard_indices: List[int]) -> None:
    """Drop what interrupted writes of these shards left; other workers' shards are not touched."""
    for shard_index in shard_indices:
        for stale in shards_dir(out).glob(f"{TMP_PREFIX}{shard_path(out, shard_index).name}-*"):
            shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def quiet_datasets():
    """Silence `datasets`' own progress bars (they would tear through the distill bar)."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


def save_dataset(dataset, directory: Path) -> None:
    """save_to_disk; an empty dataset still gets one (empty) Arrow file, so load_from_disk reads it back."""
    with quiet_datasets():
        dataset.save_to_disk(str(directory), num_shards=1 if len(dataset) == 0 else None)


def write_shard(out: Path, shard_index: int, rows: List[dict], problems: List[dict], features=None,
                cut: Optional[List[dict]] = None) -> Path:
    """Write a shard (rows, its errors.jsonl and counts.json) in a temp dir and rename it into place. `features`:
    the rows' schema (default: regenerated conversations, ROW_FEATURES; a method's records bring their own).
    `cut`: the server engine's cut answers (its cut.jsonl; None writes none)."""
    from datasets import Dataset

    features = ROW_FEATURES if features is None else features
    columns = {name: [row[name] for row in rows] for name in features}
    statuses = [item["status"] for item in problems]
    counts = {"input": len(rows) + len(problems), "ok": len(rows), "error": statuses.count("error"),
              "skipped": statuses.count("skipped"), "write_id": uuid.uuid4().hex}
    with atomic_dir(shard_path(out, shard_index)) as tmp:
        save_dataset(Dataset.from_dict(columns, features=features), tmp)
        write_json(tmp / ERRORS, problems)
        if cut is not None:
            write_json(tmp / CUT, cut)
        write_json(tmp / SHARD_COUNTS, counts)
    return shard_path(out, shard_index)


def throughput_path(out: Path, worker_index: int, num_workers: int) -> Path:
    return out / "throughput" / f"worker-{worker_index:05d}-of-{num_workers:05d}.json"


@contextmanager
def merge_lock(out: Path) -> Iterator[None]:
    """An exclusive lock on out/.merge.lock for the merge (flock: freed if the holder dies)."""
    with open(out / MERGE_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as err:  # a filesystem without locks: merges are deterministic, the last one wins
            log.warning("cannot lock %s (%s); merging without the lock", out / MERGE_LOCK, err)
        yield


def _shard_record(out: Path, shard_index: int) -> dict:
    """A shard's counts.json, checked to hold every count."""
    path = shard_path(out, shard_index) / SHARD_COUNTS
    with reading(path, "shard file", REDO_SHARD.format(path=shard_path(out, shard_index))):
        record = json.loads(path.read_text())
        missing = [key for key in COUNT_KEYS if not isinstance(record.get(key), int)]
        if missing:
            raise ValueError(f"no count {missing[0]!r}")
    return record


def _shard_records(out: Path, num_shards: int) -> Dict[str, dict]:
    return {shard_path(out, i).name: _shard_record(out, i) for i in range(num_shards)}


def _shard_problems(out: Path, shard_index: int, name: str = ERRORS) -> List[dict]:
    """A shard's errors.jsonl (or cut.jsonl) entries."""
    path = shard_path(out, shard_index) / name
    with reading(path, "shard file", REDO_SHARD.format(path=shard_path(out, shard_index))):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _shard_rows(out: Path, shard_index: int, record: dict):
    """A shard's rows, read through (a truncated Arrow file names itself), as many as its counts say."""
    path = shard_path(out, shard_index)
    with quiet_datasets():
        rows = load_rows(path, "shard", REDO_SHARD)
    if len(rows) != record["ok"]:
        raise SpecdraftError(f"corrupt shard {path}: {len(rows)} rows, its counts.json says {record['ok']}; "
                             f"{REDO_SHARD.format(path=path)}")
    return rows


def _already_merged(out: Path, records: Dict[str, dict]) -> bool:
    merged = out / MERGED
    if not (merged.is_file() and counts_path(out).is_file() and dataset_dir(out).is_dir()):
        return False
    write_ids = {name: record.get("write_id") for name, record in records.items()}
    with reading(merged, "merge record", "delete it and run `specdraft distill-data RECIPE --merge` again"):
        return json.loads(merged.read_text()).get("shards") == write_ids


def _check_counts(out: Path, counts: dict, num_input: int) -> None:
    """The shards' counts add up to the prompt sets' conversations (ok + error + skipped = input)."""
    if counts["input"] != num_input or counts["ok"] + counts["error"] + counts["skipped"] != counts["input"]:
        raise SpecdraftError(f"the shards in {shards_dir(out)} count {counts}, the prompt sets hold {num_input} "
                             f"conversations; distill into a new distill.output_dir (or delete {out})")


def merge_shards(out: Path, num_shards: int, num_input: int) -> dict:
    """Concatenate all shards into dataset/, merge their counts, errors and throughput; -> counts.

    Holds the merge lock; skipped (returning the existing counts) when the current shards were merged already.
    Every shard is read through before anything is written: a corrupt one is an error naming it, and leaves the
    merged files as they were; merged.json, written last, marks a merge that finished."""
    from datasets import concatenate_datasets

    with merge_lock(out):
        records = _shard_records(out, num_shards)
        if _already_merged(out, records):
            return read_counts(out)
        counts = {key: sum(record[key] for record in records.values()) for key in COUNT_KEYS}
        _check_counts(out, counts, num_input)
        for stale in [*out.glob(f"{TMP_PREFIX}dataset-*"), *out.glob(".old-dataset-*")]:  # killed merges
            shutil.rmtree(stale, ignore_errors=True)
        problems, parts, cut, served = [], [], [], False
        for shard_index, record in enumerate(records.values()):
            problems += _shard_problems(out, shard_index)
            if (shard_path(out, shard_index) / CUT).is_file():  # written by the server engine
                cut, served = cut + _shard_problems(out, shard_index, CUT), True
            parts.append(_shard_rows(out, shard_index, record))
        throughput = merged_throughput(out)  # read through too before anything is written
        with atomic_dir(dataset_dir(out)) as tmp:
            save_dataset(concatenate_datasets(parts), tmp)
        write_json(out / ERRORS, problems)
        if served:
            write_json(out / CUT, cut)
        write_json(counts_path(out), counts)
        write_json(out / THROUGHPUT, throughput)
        write_json(out / MERGED, {"shards": {name: record.get("write_id") for name, record in records.items()}})
    return counts


def _throughput_record(path: Path) -> dict:
    """A worker's throughput record, checked to hold what the merge adds up."""
    with reading(path, "throughput record", "delete it and run `specdraft distill-data RECIPE --merge` again"):
        record = json.loads(path.read_text())
        missing = [key for key in ("worker", "device", "shards", "generated_tokens", "generate_seconds",
                                   "tokens_per_s", "started", "finished") if key not in record]
        if missing:
            raise ValueError(f"no {missing[0]!r}")
    return record


def merged_throughput(out: Path) -> dict:
    """All workers of the latest run together: tokens, the sum of their generation rates (time inside
    generate) and tokens per wall-clock second from the first worker's start to the last one's end."""
    files = sorted((out / "throughput").glob("worker-*.json"), key=lambda path: path.stat().st_mtime)
    if not files:
        return {}
    latest_run = files[-1].stem.rpartition("-of-")[2]
    workers = [_throughput_record(path) for path in files if path.stem.endswith(f"-of-{latest_run}")]
    workers.sort(key=lambda item: item["worker"])
    tokens = sum(item["generated_tokens"] for item in workers)
    wall = max(item["finished"] for item in workers) - min(item["started"] for item in workers)
    servers = [item["server"] for item in workers if "server" in item]
    return {"workers": int(latest_run), "device": workers[0]["device"],
            "shards": sum(item["shards"] for item in workers), "generated_tokens": tokens,
            "generate_seconds": max(item["generate_seconds"] for item in workers),
            "tokens_per_s": sum(item["tokens_per_s"] for item in workers), "wall_seconds": wall,
            "wall_tokens_per_s": tokens / max(wall, 1e-9), **({"server": merged_server(servers)} if servers else {}),
            "per_worker": workers}


def merged_server(servers: List[dict]) -> dict:
    """The server engine's stats of all workers: counts summed; the per-request latency of one worker as it is,
    of several the slowest worker's p50 and p90 (each worker's own are under per_worker)."""
    summed = {key: sum(item[key] for item in servers) for key in ("answered", "refused", "failed", "retries",
                                                                   "answer_tokens")}
    worst = {key: max((item[key] for item in servers if item[key] is not None), default=None)
             for key in ("latency_p50_s", "latency_p90_s")}
    return {"url": servers[0]["url"], "api": servers[0]["api"], "model": servers[0]["model"], **summed, **worst}
