"""tools/plot_acceptance.py: several eval reports -> one plot, a table and a JSON of τ and rates. CPU."""
import importlib.util
import json
from pathlib import Path

import pytest

from specdraft.eval.chain import acceptance_by_position

TOOL = Path(__file__).resolve().parents[1] / "tools" / "plot_acceptance.py"


def _tool():
    spec = importlib.util.spec_from_file_location("plot_acceptance", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path, accepted, k):
    report = {"tau": sum(a + 1 for a in accepted) / len(accepted), "prompts": 2, "lossless": True,
              "acceptance_by_position": acceptance_by_position(accepted, k)}
    path.write_text(json.dumps(report))
    return path


def test_plot_table_and_json(tmp_path, capsys):
    first = _write(tmp_path / "a.json", [0, 1, 3, 3], 3)
    second = _write(tmp_path / "b.json", [2, 3, 3, 1], 3)
    out = tmp_path / "plot" / "acceptance.png"
    assert _tool().main([f"EAGLE-3={first}", f"PosS-2={second}", "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["EAGLE-3"]["acceptance_by_position"] == pytest.approx([0.75, 2 / 3, 1.0])
    assert summary["EAGLE-3"]["accepted_through"] == pytest.approx([0.75, 0.5, 0.5])  # cycles with >= i accepted
    assert summary["PosS-2"]["tau"] == pytest.approx(3.25)
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0] == "| run | τ | p1 | p2 | p3 |" and rows[3].startswith("| PosS-2 | 3.250 | 1.00 |")


def test_bad_argument_names_it(tmp_path):
    with pytest.raises(SystemExit, match="not LABEL=PATH"):
        _tool().main(["nolabel", "--out", str(tmp_path / "x.png")])
