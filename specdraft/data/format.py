"""The distilled dataset's on-disk layout: the one contract between `specdraft.distill` and the trainer.

DISTILL_DIR/
  shards/shard-00000/ ...   one Hugging Face `datasets` dataset per shard (Arrow), written atomically
  dataset/                  all shards concatenated (save_to_disk), written last
  counts.json               {"input": N, "ok": a, "error": b, "skipped": c} with a + b + c == N
  errors.jsonl              one line per prompt that failed or was skipped: source, index, reason
  cut.jsonl                 distill.engine=server: one line per answer the server cut at a length limit
  recipe.yaml               the resolved recipe that produced it
  features/                 with data.features=offline: the target's hidden states (specdraft.data.features)
  images/                   image prompt sets: each image once, named by its content hash (specdraft.data.images)
Rows: the columns of ROW_FEATURES (IMAGE_ROW_FEATURES for a vision-language target's). Every Arrow directory is
read through `load_rows`: a truncated or corrupt file is one line naming it and saying how to write it again.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from datasets import Features, Sequence, Value

from specdraft.core.errors import SpecdraftError, error_summary
from specdraft.core.io import reading

ROW_FEATURES = Features({
    "input_ids": Sequence(Value("int32")),  # the whole conversation, chat template applied
    "loss_mask": Sequence(Value("int8")),  # 1 on the target's own answer tokens (assistant spans)
    "source": Value("string"),  # the prompt file or dataset id
    "index": Value("int64"),  # the conversation's index in that source
    "turns": Value("int32"),  # assistant turns regenerated
    "target": Value("string"),  # target path or hub id
    "target_revision": Value("string"),
    "temperature": Value("float32"),
    "top_p": Value("float32"),
    "seed": Value("int64"),
    "max_new_tokens": Value("int32"),
})
IMAGE_ROW_FEATURES = Features({
    **ROW_FEATURES,
    "images": Sequence(Value("string")),  # the conversation's images, in order: names under DISTILL_DIR (images/...)
})
"""Rows distilled by a vision-language target: ROW_FEATURES and the images (input_ids expand each into its tokens)."""


def dataset_dir(distill_dir: str | Path) -> Path:
    return Path(distill_dir) / "dataset"


def shards_dir(distill_dir: str | Path) -> Path:
    return Path(distill_dir) / "shards"


def counts_path(distill_dir: str | Path) -> Path:
    return Path(distill_dir) / "counts.json"


def read_counts(distill_dir: str | Path) -> dict:
    with reading(counts_path(distill_dir), "counts file", "run `specdraft distill-data RECIPE --merge` again"):
        return json.loads(counts_path(distill_dir).read_text())


REDO_DATASET = "delete {path} and run `specdraft distill-data RECIPE --merge` to merge it again from its shards"
"""How to write a merged dataset again (`load_rows`'s `fix` for DISTILL_DIR/dataset)."""


def load_rows(directory: str | Path, what: str, fix: str):
    """`datasets.load_from_disk(directory)` with every Arrow file read through and validated (offsets in bounds,
    UTF-8 strings): a truncated or corrupt file is a SpecdraftError naming it as a `what` and ending with `fix`
    (`{path}` in it stands for the directory)."""
    from datasets import load_from_disk

    directory = Path(directory)
    try:
        dataset = load_from_disk(str(directory))
        dataset.data.validate(full=True)
    except Exception as err:  # noqa: BLE001 (Arrow, datasets and the OS raise many kinds for a bad file)
        bad = _bad_arrow_file(directory) or directory
        raise SpecdraftError(f"corrupt {what} {bad}: {error_summary(err)}; "
                             f"{fix.format(path=directory)}") from None
    return dataset


def _bad_arrow_file(directory: Path) -> Optional[Path]:
    """The first Arrow file of `directory` that does not read back whole and valid, or None."""
    import pyarrow as pa

    for path in sorted(directory.glob("*.arrow")):
        try:
            with pa.memory_map(str(path)) as source:
                pa.ipc.open_stream(source).read_all().validate(full=True)
        except Exception:  # noqa: BLE001 (any failure marks the file)
            return path
    return None
