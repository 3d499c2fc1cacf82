"""tools/concat_distilled.py: two distilled runs become one dataset, counts summed; unfinished inputs refused."""
import json
import shutil
from pathlib import Path

import pytest

from specdraft.data.format import counts_path, dataset_dir
from tests.tools import load_tool

concat_distilled = load_tool("concat_distilled")


def _with_counts(source: Path, directory: Path, ok: int) -> Path:
    shutil.copytree(source, directory)
    counts_path(directory).write_text(json.dumps({"input": ok + 1, "ok": ok, "error": 0, "skipped": 1}))
    return directory


def test_concat_keeps_every_row_and_sums_counts(distilled, tmp_path):
    from datasets import load_from_disk

    first = _with_counts(distilled, tmp_path / "one", 12)
    counts = concat_distilled.concat(tmp_path / "all", [first, first])
    rows = load_from_disk(str(dataset_dir(tmp_path / "all")))
    assert len(rows) == 24 and rows[12]["input_ids"] == rows[0]["input_ids"]
    assert counts == {"input": 26, "ok": 24, "error": 0, "skipped": 2}
    assert json.loads(counts_path(tmp_path / "all").read_text()) == counts


def test_an_unfinished_input_is_refused(distilled, tmp_path):
    with pytest.raises(SystemExit, match="no merged dataset"):
        concat_distilled.concat(tmp_path / "all", [_with_counts(distilled, tmp_path / "one", 12), tmp_path / "missing"])
