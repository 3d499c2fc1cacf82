"""tools/bench_activations.py in its tiny configuration: each activation checkpointing mode keeps less for the
backward than the one before it. CPU."""
import json

from tests.tools import load_tool


def test_each_mode_keeps_less_than_the_one_before(tmp_path, capsys):
    bench = load_tool("bench_activations")
    out = tmp_path / "activations.json"
    bench.main(["--config", "tiny", "--out", str(out)])
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["none", "swiglu", "selective", "full"]
    layer = [rows[mode]["layer"] for mode in rows]
    assert layer[0] > layer[1] > layer[2] > layer[3] > 0
    assert rows["selective"]["head_loss"] < rows["none"]["head_loss"]
    assert rows["full"]["weight_casts"] == 0
    assert "kept for the backward" in capsys.readouterr().out
