"""Sweep Kangaroo's exit layer ℓ and confidence exit η in specdraft's runtime (issue 5).

    python tools/bench_kangaroo.py EXPORT_DIR [EXPORT_DIR ...] --eta 0 0.3 0.5 0.7 0.9 \
        [--prompts FILE] [--max-prompts N] [--max-new-tokens N] [--depth K] [--dynamic-exit] [--choose-exit] \
        [--device cpu] [--out DIR]

Each export (one ℓ each) is loaded once as a chain of --depth drafts; for every η the runtime decodes the same
prompts at T=0 with plain decoding and with speculative decoding, in the same run (`bench.run_temperature`), so
the speedup is measured against plain decoding on the same machine and the same warm caches. Prints a table
(ℓ, η, τ, drafted tokens per cycle, tokens/s, speedup over plain decoding, lossless, adapter parameters) and
writes DIR/sweep.json with every run's full summary. `--choose-exit` adds the rows of one runtime holding every
export, where DEL picks the exit layer and the draft length per cycle (ℓ shown as "1+2", with the share of
cycles drafted at each ℓ in the JSON).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from specdraft.core.io import write_json
from specdraft.runtime.bench import BenchSettings, first_user_turns, run_temperature
from specdraft.config import RuntimeConfig
from specdraft.runtime.load import load_runtime


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exports", nargs="+", help="Kangaroo export directories (one exit layer each)")
    parser.add_argument("--eta", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--prompts", default=None, help="prompt file (default: MT-bench's questions)")
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--depth", type=int, default=6, help="chain length before exits")
    parser.add_argument("--dynamic-exit", action="store_true", help="DEL's draft length as well")
    parser.add_argument("--choose-exit", action="store_true", help="also: all exports in one runtime, DEL choosing ℓ")
    parser.add_argument("--no-shallow-reuse", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--out", default="bench_kangaroo")
    return parser.parse_args(argv)


def sweep_export(paths: List[str], args: argparse.Namespace) -> List[dict]:
    """Every η over one export (or, with several, all in one runtime choosing the exit) -> one row per η."""
    settings = RuntimeConfig(chain=True, depth=args.depth, exit_threshold=0.0,
                             dynamic_exit=args.dynamic_exit or len(paths) > 1, shallow_reuse=not args.no_shallow_reuse,
                             more_exits=list(paths[1:]), device=args.device, dtype=args.dtype, max_len=args.max_len)
    runtime = load_runtime(paths[0], settings)
    settings = BenchSettings(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, temperatures=(0.0,),
                             hf_baseline=False, **({"prompts": args.prompts} if args.prompts else {}))
    prompts = first_user_turns(runtime, settings.prompts, settings.max_prompts)
    drafter = runtime.engine.drafter
    layers = list(drafter.caps.exit_layers) or [drafter.caps.shallow_layers]
    adapter_params = _adapter_params(paths) if len(paths) > 1 else _params(runtime.draft.draft)
    rows = []
    for eta in args.eta:
        runtime.engine.set_exit_threshold(eta)
        summary = run_temperature(runtime, prompts, settings, 0.0, [])
        rows.append({"exports": paths, "exit_layer": "+".join(map(str, layers)), "eta": eta,
                     "verify_start_layer": runtime.engine.chain.start_layer, "adapter_params": adapter_params,
                     **summary})
    return rows


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _adapter_params(paths: List[str]) -> int:
    from specdraft.drafts import load_draft

    return sum(_params(load_draft(path).draft) for path in paths)


def format_table(rows: List[dict]) -> str:
    lines = ["| ℓ | η | τ | drafted/cycle | spec tok/s | plain tok/s | speedup | lossless | adapter params |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['exit_layer']} | {r['eta']:g} | {r['tau']:.2f} | {r['drafted_per_cycle']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['tokens_per_s_plain']:.1f} | {r['speedup_vs_plain']:.2f} | "
                     f"{r['lossless']} | {r['adapter_params']:,} |")
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    runs = [[path] for path in args.exports] + ([list(args.exports)] if args.choose_exit else [])
    rows = [row for paths in runs for row in sweep_export(paths, args)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "exports"}
    write_json(out / "sweep.json", {"settings": settings, "rows": rows})
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
