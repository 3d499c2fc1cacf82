"""Merge eval.json files of disjoint prompt ranges (eval.skip_prompts / eval.max_prompts) into one report.

    python -m tools.merge_eval OUT.json a/eval.json b/eval.json ...
"""
from __future__ import annotations

import json
import sys


def merge(reports: list) -> dict:
    histogram = [sum(col) for col in zip(*(r["accepted_histogram"] for r in reports))]
    cycles = sum(histogram)
    rates = []
    for position in range(len(histogram) - 1):
        reached = sum(histogram[position:])
        rates.append(sum(histogram[position + 1:]) / reached if reached else 0.0)
    keys = ("prompts", "lossless_prompts", "new_tokens", "seconds_speculative", "seconds_greedy_hf")
    merged = {k: sum(r[k] for r in reports) for k in keys}
    merged.update(tau=sum((a + 1) * n for a, n in enumerate(histogram)) / cycles, cycles=cycles,
                  acceptance_by_position=rates, accepted_histogram=histogram,
                  lossless=all(r["lossless"] for r in reports),
                  settings={**reports[0]["settings"], "merged_from": len(reports)})
    return merged


if __name__ == "__main__":
    merged = merge([json.load(open(path)) for path in sys.argv[2:]])
    json.dump(merged, open(sys.argv[1], "w"), indent=2)
    print(f"tau={merged['tau']:.3f} lossless={merged['lossless']} prompts={merged['prompts']} "
          f"acceptance_by_position={[round(r, 3) for r in merged['acceptance_by_position']]}")
