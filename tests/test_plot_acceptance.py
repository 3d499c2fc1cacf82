"""tools/plot_acceptance.py: several eval reports -> one plot, a table and a JSON of τ and rates. CPU."""
import json

import pytest

from specdraft.decoding.stats import acceptance_by_position
from tools import plot_acceptance


def _write(path, accepted, k):
    report = {"tau": sum(a + 1 for a in accepted) / len(accepted), "prompts": 2, "lossless": True,
              "acceptance_by_position": acceptance_by_position(accepted, k)}
    path.write_text(json.dumps(report))
    return path


def test_plot_table_and_json(tmp_path, capsys):
    first = _write(tmp_path / "a.json", [0, 1, 3, 3], 3)
    second = _write(tmp_path / "b.json", [2, 3, 3, 1], 3)
    out = tmp_path / "plot" / "acceptance.png"
    assert plot_acceptance.main([f"EAGLE-3={first}", f"PosS-2={second}", "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["EAGLE-3"]["acceptance_by_position"] == pytest.approx([0.75, 2 / 3, 1.0])
    assert summary["EAGLE-3"]["accepted_through"] == pytest.approx([0.75, 0.5, 0.5])  # cycles with >= i accepted
    assert summary["PosS-2"]["tau"] == pytest.approx(3.25)
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0] == "| run | τ | tokens/s | plain tokens/s | speedup | cycle ms | p1 | p2 | p3 |"
    assert rows[3].startswith("| PosS-2 | 3.250 | n/a | n/a | n/a | n/a | 1.00 |")


def test_bench_reports_give_their_greedy_run(tmp_path, capsys):
    run = {"temperature": 0.0, "tau": 2.0, "acceptance_by_position": [0.5, 1.0], "tokens_per_s": 80.0,
           "tokens_per_s_plain": 50.0, "speedup_vs_plain": 1.6, "lossless": True, "prompts": 2}
    sampled = {**run, "temperature": 1.0, "tau": 1.5}
    report = {"tau": 2.0, "runs": [sampled, run], "cycle_profile": {"cycle_ms": 2.25}}
    (tmp_path / "bench.json").write_text(json.dumps(report))
    assert plot_acceptance.main([f"Kangaroo={tmp_path / 'bench.json'}", "--out", str(tmp_path / "a.png")]) == 0
    assert "| Kangaroo | 2.000 | 80.0 | 50.0 | 1.60 | 2.250 | 0.50 | 1.00 |" in capsys.readouterr().out


def test_bad_argument_names_it(tmp_path):
    with pytest.raises(SystemExit, match="not LABEL=PATH"):
        plot_acceptance.main(["nolabel", "--out", str(tmp_path / "x.png")])
