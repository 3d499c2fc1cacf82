"""Concatenate distilled datasets (`specdraft distill-data` output dirs) into one that `train` reads.

    python tools/concat_distilled.py OUT_DIR DISTILL_DIR [DISTILL_DIR ...]

Writes OUT_DIR/dataset (rows of every input, in order) and OUT_DIR/counts.json (the inputs' counts summed, so
every prompt stays accounted for). Inputs must hold rows of the same target (the `target` column); an input
without a merged dataset (an unfinished run) is an error, not a silent gap.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdraft.data.format import counts_path, dataset_dir, read_counts


def concat(out_dir: Path, inputs: list) -> dict:
    from datasets import concatenate_datasets, load_from_disk

    for directory in inputs:
        if not dataset_dir(directory).is_dir() or not counts_path(directory).is_file():
            raise SystemExit(f"concat_distilled: {directory} has no merged dataset/ and counts.json "
                             f"(finish or merge that run first: specdraft distill-data --merge)")
    parts = [load_from_disk(str(dataset_dir(directory))) for directory in inputs]
    targets = {target for part in parts for target in set(part.unique("target"))}
    if len(targets) > 1:
        raise SystemExit(f"concat_distilled: inputs come from different targets: {sorted(targets)}")
    counts = {}
    for directory in inputs:
        for key, value in read_counts(directory).items():
            counts[key] = counts.get(key, 0) + value
    out_dir.mkdir(parents=True, exist_ok=True)
    concatenate_datasets(parts).save_to_disk(str(dataset_dir(out_dir)))
    counts_path(out_dir).write_text(json.dumps(counts) + "\n")
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("inputs", type=Path, nargs="+")
    args = parser.parse_args(argv)
    print(json.dumps(concat(args.out_dir, args.inputs)))


if __name__ == "__main__":
    main()
