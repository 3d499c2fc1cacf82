"""A bench run's decoding time split into a cost a prompt and a cost a step, from its per-prompt figures.

    python tools/loop_costs.py NAME=runs/bench/bench.json [NAME=...] [--out DIR]

For each run (T=0) it fits, over the prompts, plain seconds = a + b · tokens and speculative seconds = a' + b' ·
cycles (least squares), and sets b and b' beside the step graphs `bench` replayed back to back (cycle_profile's
`plain_step_ms` and `cycle_ms`): a step cost well above its graph is time spent between steps; a prompt cost well
above one prefill is time spent around each prompt. Prints a table and writes DIR/loop_costs.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from specdraft.core.io import write_json  # noqa: E402


def fit_line(steps: Sequence[float], seconds: Sequence[float]) -> Tuple[float, float]:
    """Least squares seconds = a + b * steps -> (a, b); with one distinct step count, a = 0."""
    count = len(steps)
    mean_steps, mean_seconds = sum(steps) / count, sum(seconds) / count
    spread = sum((s - mean_steps) ** 2 for s in steps)
    if spread == 0:
        return 0.0, mean_seconds / mean_steps
    slope = sum((s - mean_steps) * (t - mean_seconds) for s, t in zip(steps, seconds)) / spread
    return mean_seconds - slope * mean_steps, slope


def loop_costs(report: Dict) -> Dict:
    """bench.json -> the T=0 run's per-prompt and per-step costs (ms) of each loop beside its graph."""
    run = next(r for r in report["runs"] if r["temperature"] == 0)
    rows = run.get("per_prompt")
    if not rows:
        raise SystemExit("this bench.json has no per_prompt figures (bench before Session 18)")
    profile = report.get("cycle_profile") or {}
    plain_a, plain_b = fit_line([r["plain_tokens"] for r in rows], [r["plain_s"] for r in rows])
    spec_a, spec_b = fit_line([r["spec_cycles"] for r in rows], [r["spec_s"] for r in rows])
    return {"prompts": len(rows), "tau": run["tau"], "speedup_vs_plain": run["speedup_vs_plain"],
            "plain_prompt_ms": 1000 * plain_a, "plain_step_ms": 1000 * plain_b,
            "plain_graph_ms": profile.get("plain_step_ms"),
            "spec_prompt_ms": 1000 * spec_a, "spec_cycle_ms": 1000 * spec_b, "cycle_graph_ms": profile.get("cycle_ms")}


def table(rows: List[Tuple[str, Dict]]) -> str:
    fmt = lambda value: "n/a" if value is None else f"{value:.3f}"  # noqa: E731
    lines = ["| run | prompts | τ | speedup | plain ms a prompt | plain ms a step | plain graph | "
             "spec ms a prompt | spec ms a cycle | cycle graph |", "|---" * 10 + "|"]
    for name, c in rows:
        lines.append(f"| {name} | {c['prompts']} | {c['tau']:.3f} | {c['speedup_vs_plain']:.2f} | "
                     f"{fmt(c['plain_prompt_ms'])} | {fmt(c['plain_step_ms'])} | {fmt(c['plain_graph_ms'])} | "
                     f"{fmt(c['spec_prompt_ms'])} | {fmt(c['spec_cycle_ms'])} | {fmt(c['cycle_graph_ms'])} |")
    return "\n".join(lines)


def main(argv=None) -> List[Tuple[str, Dict]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=path/to/bench.json")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for item in args.runs:
        name, _, path = item.partition("=")
        rows.append((name, loop_costs(json.loads(Path(path or name).read_text()))))
    print(table(rows))
    if args.out:
        write_json(Path(args.out) / "loop_costs.json", {name: costs for name, costs in rows})
    return rows


if __name__ == "__main__":
    main()
