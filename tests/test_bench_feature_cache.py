"""The feature cache suite, tools/bench/feature_cache.py, on tiny batches on the CPU."""
import json

from tools.bench import feature_cache


def test_feature_cache_times_writes_and_reads_of_the_hybrid_cache(tmp_path, capsys):
    """Every batch written, then read back, through the hybrid cache's own code; the parts of each batch add up to
    its whole, and the cache is removed after."""
    status = feature_cache.main(["--hidden", "8", "--names", "2", "--rows", "3", "--tokens", "5", "--pad-to", "7",
                                 "--batches", "4", "--out", str(tmp_path / "out")])
    assert status == 0
    saved = json.loads((tmp_path / "out" / "feature_cache.json").read_text())
    assert saved["batch_mb"] == 3 * 5 * 8 * 2 * 2 / 1e6 and [row["op"] for row in saved["rows"]] == ["write", "read"]
    assert all(len(times) == 4 for times in saved["phase_ms_each"].values())
    assert all(row["ms"] >= max(row["parts_ms"].values()) > 0 for row in saved["rows"])
    assert not list(tmp_path.glob("feature_cache_*"))
    assert "read+stack" in capsys.readouterr().out
