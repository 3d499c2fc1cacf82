"""The distilled dataset's on-disk layout: the one contract between `data_gen` and the trainer.

DISTILL_DIR/
  shards/shard-00000/ ...   one Hugging Face `datasets` dataset per shard (Arrow), written atomically
  dataset/                  all shards concatenated (save_to_disk), written last
  counts.json               {"input": N, "ok": a, "error": b, "skipped": c} with a + b + c == N
  errors.jsonl              one line per prompt that failed or was skipped: source, index, reason
  recipe.yaml               the resolved recipe that produced it
  features/                 with data.features=offline: the target's hidden states (specdraft.data.features)
  images/                   image prompt sets: each image once, named by its content hash (specdraft.data.images)
Rows: the columns of ROW_FEATURES (IMAGE_ROW_FEATURES for a vision-language target's).
"""
from __future__ import annotations

import json
from pathlib import Path

from datasets import Features, Sequence, Value

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
    return json.loads(counts_path(distill_dir).read_text())
