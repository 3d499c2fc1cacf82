"""Which draft tree gives the most speed for one draft (issue 3): `specdraft bench` at T=0 for each shape, the
same prompts, each shape's speedup over plain decoding measured in the same process as its own run.

A shape is DEPTH,TOPK,BUDGET (a tree: TOPK children per expanded node, BUDGET nodes verified with the root), or
DEPTH alone (a chain of DEPTH drafts). The target and draft are loaded once; each shape builds its own runtime
over them (its CUDA graphs are per shape) and benches every prompt: plain decoding, then speculative,
lossless-checked token for token. Writes
OUT/bench_tree_shapes.json after every shape (a failing shape is recorded with its error), then prints a table
sorted by its last column: each shape's tokens/s over the median of every shape's plain rate, so that one plain
run that reads slow (Session 14's first shape read 617 tokens/s against 905-935 for the other seven) does not
decide the ranking.

    python tools/bench_tree_shapes.py EXPORT --shapes 6 6,8,48 6,4,24 5,8,32 8,8,64 \\
        --prompts .data/mt_bench.jsonl --max-prompts 20 --out runs/tree_shapes
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_shape(text: str):
    """'6' -> a chain of 6; '6,8,48' -> TreeShape(6, 8, 48), validated."""
    from specdraft.errors import SpecdraftError
    from specdraft.runtime.tree import TreeShape

    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        raise SpecdraftError(f"shape {text!r}: DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree) of integers") from None
    if len(numbers) == 1:
        return TreeShape.chain(numbers[0]).validated()
    if len(numbers) != 3:
        raise SpecdraftError(f"shape {text!r}: DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree)")
    return TreeShape(*numbers).validated()


def check_shapes(parser: argparse.ArgumentParser, texts: List[str]) -> None:
    """Every shape parsed before any work starts; a bad one is the parser's usage error."""
    from specdraft.errors import SpecdraftError

    for text in texts:
        try:
            parse_shape(text)
        except SpecdraftError as err:
            parser.error(str(err))


def bench_shape(args, parts, text: str) -> dict:
    """parts: load_parts' (draft, target), shared by every shape."""
    from specdraft.runtime.bench import BenchSettings, first_user_turns, run_temperature
    from specdraft.runtime.load import build_runtime

    shape = parse_shape(text)
    runtime = build_runtime(*parts, shape, use_graphs=False if args.no_cuda_graphs else None)
    settings = BenchSettings(prompts=args.prompts, max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens,
                             temperatures=(0.0,), hf_baseline=False)
    prompts = first_user_turns(runtime, settings.prompts, settings.max_prompts)
    summary = run_temperature(runtime, prompts, settings, 0.0, [])
    keep = ("tau", "tokens_per_s", "tokens_per_s_plain", "speedup_vs_plain", "lossless_prompts", "prompts",
            "acceptance_by_position", "cycles")
    return {"shape": text, "depth": shape.depth, "topk": shape.topk, "budget": shape.budget,
            **{key: summary[key] for key in keep}}


def with_median_plain(rows: List[dict]) -> List[dict]:
    """Each benched row with speedup_vs_median_plain: its tokens/s over the median plain rate of all rows."""
    plain_rates = [row["tokens_per_s_plain"] for row in rows if "error" not in row]
    if not plain_rates:
        return rows
    median = statistics.median(plain_rates)
    return [row if "error" in row else {**row, "speedup_vs_median_plain": row["tokens_per_s"] / median}
            for row in rows]


def table(rows: List[dict]) -> str:
    lines = [f"{'shape':>10} {'tau':>6} {'tokens/s':>9} {'plain':>8} {'speedup':>8} {'lossless':>9} "
             f"{'x median plain':>14}"]
    for row in sorted(rows, key=lambda r: -(r.get("speedup_vs_median_plain") or 0)):
        if "error" in row:
            lines.append(f"{row['shape']:>10} error: {row['error'].splitlines()[0][:80]}")
            continue
        lines.append(f"{row['shape']:>10} {row['tau']:>6.3f} {row['tokens_per_s']:>9.1f} "
                     f"{row['tokens_per_s_plain']:>8.1f} {row['speedup_vs_plain']:>8.3f} "
                     f"{row['lossless_prompts']:>4}/{row['prompts']:<4} {row['speedup_vs_median_plain']:>14.3f}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="an export directory (or a training run directory)")
    parser.add_argument("--shapes", nargs="+", required=True, help="DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree)")
    parser.add_argument("--prompts", required=True, help="a prompt file, as for `specdraft bench --prompts`")
    parser.add_argument("--max-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--target", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from specdraft.io import write_json
    from specdraft.runtime.load import load_parts

    check_shapes(parser, args.shapes)
    parts = load_parts(args.export, args.target, args.device, args.dtype)
    rows: List[dict] = []
    for text in args.shapes:
        try:
            rows.append(bench_shape(args, parts, text))
        except Exception as err:  # recorded; the next shape still runs
            rows.append({"shape": text, "error": f"{type(err).__name__}: {err}"[:2000]})
        rows = with_median_plain(rows)
        report = {"export": str(args.export), "prompts": args.prompts, "max_prompts": args.max_prompts,
                  "max_new_tokens": args.max_new_tokens, "rows": rows}
        write_json(args.out / "bench_tree_shapes.json", report)
    print(table(rows))
    print(f"-> {args.out / 'bench_tree_shapes.json'}")
    return report


if __name__ == "__main__":
    main()
