"""Acceptance by draft position for several evaluations on one plot (e.g. EAGLE-3 against PosS-1/2/3), with a
table of τ and the per-position rates.

    python -m tools.plot_acceptance --out runs/acceptance.png \
        EAGLE-3=runs/eagle3/eval/eval.json PosS-2=runs/poss2/eval/eval.json

Each argument is LABEL=PATH of an `eval.json` (`specdraft eval`, tools/merge_eval.py) or a `bench.json`
(`specdraft bench`: its T=0 run, with tokens/s, plain decoding's tokens/s, the speedup over plain decoding and
the whole cycle's time as run in the table). Prints a
Markdown table; writes the plot and, beside it, a JSON with each run's τ, conditional acceptance by position
(P(draft i accepted | drafts < i accepted)) and the share of cycles that reach position i (their product).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

from specdraft.core.io import write_json


def load_runs(pairs: List[str]) -> Dict[str, dict]:
    runs = {}
    for pair in pairs:
        label, sep, path = pair.partition("=")
        if not sep or not label:
            raise SystemExit(f"plot_acceptance: argument {pair!r} is not LABEL=PATH")
        report = json.loads(Path(path).read_text())
        cycle_ms = (report.get("cycle_profile") or {}).get("cycle_ms")
        if "runs" in report:  # a `specdraft bench` report: its T=0 run
            report = next((run for run in report["runs"] if run["temperature"] == 0), report["runs"][0])
        conditional = report["acceptance_by_position"]
        reached, running = [], 1.0
        for rate in conditional:
            running *= rate
            reached.append(running)
        runs[label] = {"tau": report["tau"], "acceptance_by_position": conditional, "accepted_through": reached,
                       "prompts": report.get("prompts"), "lossless": report.get("lossless"), "source": path,
                       "tokens_per_s": report.get("tokens_per_s"),
                       "tokens_per_s_plain": report.get("tokens_per_s_plain"),
                       "speedup_vs_plain": report.get("speedup_vs_plain"), "cycle_ms": cycle_ms}
    return runs


def table(runs: Dict[str, dict]) -> str:
    depth = max(len(r["acceptance_by_position"]) for r in runs.values())
    lines = ["| run | τ | tokens/s | plain tokens/s | speedup | cycle ms | " +
             " | ".join(f"p{i + 1}" for i in range(depth)) + " |", "|---|---|---|---|---|---|" + "---|" * depth]
    fmt = lambda value, places: "n/a" if value is None else f"{value:.{places}f}"  # noqa: E731
    for label, run in runs.items():
        rates = [f"{rate:.2f}" for rate in run["acceptance_by_position"]] + [""] * depth
        lines.append(f"| {label} | {run['tau']:.3f} | {fmt(run['tokens_per_s'], 1)} | "
                     f"{fmt(run['tokens_per_s_plain'], 1)} | {fmt(run['speedup_vs_plain'], 2)} | "
                     f"{fmt(run['cycle_ms'], 3)} | " + " | ".join(rates[:depth]) + " |")
    return "\n".join(lines)


def plot(runs: Dict[str, dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, run in runs.items():
        rates = run["acceptance_by_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{label} (τ = {run['tau']:.2f})")
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted | earlier accepted)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=PATH/eval.json")
    parser.add_argument("--out", required=True, help="the plot (.png); the JSON goes beside it")
    parser.add_argument("--title", default="acceptance by draft position (T=0)")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, out, args.title)
    write_json(out.with_suffix(".json"), runs)
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
