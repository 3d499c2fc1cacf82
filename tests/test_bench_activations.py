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


def test_the_compiled_layer_keeps_no_more_than_the_eager_one(tmp_path):
    """train.compile casts the layer's weights outside the compiled parts, once per unroll: it keeps one bf16
    copy of each for the backward, as eager autocast does, not one per TTT step."""
    bench = load_tool("bench_activations")
    kept = {}
    for flags in ([], ["--compile"]):
        out = tmp_path / f"activations{len(flags)}.json"
        bench.main(["--config", "tiny", "--modes", "none", "selective", *flags, "--out", str(out)])
        rows = json.loads(out.read_text())["rows"]
        kept[bool(flags)] = {row["mode"]: row["layer"] + row["weight_casts"] for row in rows}
    assert all(kept[True][mode] <= kept[False][mode] for mode in ("none", "selective")), kept
