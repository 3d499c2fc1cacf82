"""Long-context suite: does a draft trained on short sequences keep its τ where the prompts are long? Two EAGLE-3
heads on one target (default SmolLM2-135M-Instruct, whose context is 8,192 tokens), trained on the same distilled
data with the same overrides: `full` as the recipe is (full attention, true positions) and `longspec` with
LongSpec's window and anchor offsets (method.attention_window=--window, attention_sinks=--sinks,
position_offset = --context less data.max_length). Each is exported and benched (`specdraft bench`, T=0, float32:
its own run is the lossless check, token for token, no HF baseline) on 1K-token prompts and on 4-7K-token prompts
(tools/long_prompts.py, built from --shared), with τ by prompt-length bucket; then its drafter is allocated at each
--cache-lengths context and its state's bytes read (a ring stays the same size, a full cache grows with it).

    python -m tools.bench.long_context --work runs/bench/long_context          # GPU: SmolLM2, the default recipe
    python -m tools.bench.long_context --data DISTILLED --work DIR train.max_steps=3000 \\
        'data.prompts=[.data/train_prompts.jsonl]'                              # more data, the same two heads

`keeps` is a head's τ on the long prompts over its τ on the 1K ones; LongSpec's claim, the goal here: longspec keeps
at least 95% where full keeps less. Writes WORK/long_context.json and prints the table; a call again skips the stages whose
output WORK holds (it resumes one cut short); --collect only reads WORK.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List

from tools.bench.suite import REPO, finish, fmt, machine, markdown_table, read_json, specdraft_stage, split_overrides

RUNS = ("full", "longspec")
SETS = {"1k": "long_prompts_1k.jsonl", "long": "long_prompts.jsonl"}
"""The prompt sets each head is benched on (tools/long_prompts.py writes both)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="τ of a full-attention and a LongSpec EAGLE-3 head on long prompts")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for distill-data and both trainings, key=value")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "eagle3_smollm2.yaml")
    parser.add_argument("--data", type=Path, default=None, help="distilled data (default: distill into WORK/data)")
    parser.add_argument("--work", type=Path, default=Path("runs/bench/long_context"))
    parser.add_argument("--shared", type=Path, default=default_shared(), help="../shared/data: the documents")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="a folder holding long_prompts.jsonl and long_prompts_1k.jsonl (default: build them "
                             "into WORK/prompts)")
    parser.add_argument("--count", type=int, default=20, help="prompts in each set")
    parser.add_argument("--long-tokens", type=int, nargs=2, default=[4000, 7000], metavar=("LOW", "HIGH"))
    parser.add_argument("--short-tokens", type=int, nargs=2, default=[768, 1023], metavar=("LOW", "HIGH"))
    parser.add_argument("--window", type=int, default=512, help="longspec's method.attention_window")
    parser.add_argument("--sinks", type=int, default=4, help="longspec's method.attention_sinks")
    parser.add_argument("--context", type=int, default=8192,
                        help="the target's context: the bench's --max-len and what the offsets reach")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--cache-lengths", nargs="+", default=[1024, 2048, 4096, 8192],
                        help="contexts (tokens) at which each drafter's state is allocated and its bytes read")
    parser.add_argument("--seed", type=int, default=0, help="the prompt sets' seed")
    parser.add_argument("--collect", action="store_true", help="only read an existing WORK")
    args = parser.parse_args(argv)
    lengths, args.overrides = split_overrides([str(n) for n in args.cache_lengths], args.overrides)
    args.cache_lengths = [int(n) for n in lengths]
    return args


def default_shared() -> Path:
    """../shared/data beside the checkout, else a shared/data inside it (the GPU machine's copy)."""
    beside = REPO.parent / "shared" / "data"
    return beside if beside.is_dir() else REPO / "shared" / "data"


def resolved_recipe(args):
    from specdraft.recipes import load_recipe

    return load_recipe(args.recipe, args.overrides)


def run_overrides(name: str, args, recipe) -> List[str]:
    """The run's own overrides: none for full; LongSpec's window, sinks and offsets for longspec."""
    if name == "full":
        return []
    offset = max(0, args.context - recipe.data.max_length)
    return [f"method.attention_window={args.window}", f"method.attention_sinks={args.sinks}",
            f"method.position_offset={offset}"]


def prompt_sets(args, recipe) -> Dict[str, Path]:
    """The two prompt sets: --prompts, or built into WORK/prompts once, measured by the recipe's target's
    tokenizer."""
    from tools.long_prompts import write_long_sets

    folder = args.prompts or args.work / "prompts"
    paths = {name: folder / file for name, file in SETS.items()}
    if args.prompts is None and not all(path.is_file() for path in paths.values()):
        write_long_sets(args.shared, folder, args.count, args.seed, recipe.target.path,
                        tuple(args.long_tokens), tuple(args.short_tokens))
    return paths


def bench_argv(args, export: Path, prompts: Path, out: Path) -> List[str]:
    count = sum(1 for line in prompts.read_text().splitlines() if line.strip())
    return ["bench", str(export), "--prompts", str(prompts), "--max-new-tokens", str(args.max_new_tokens),
            "--temperature", "0", "--dtype", "float32", "--device", args.device, "--max-len", str(args.context),
            "--no-hf", "--lossless-prompts", str(count), "--profile-cycles", "0", "--out", str(out)]


def run_stages(args, recipe, sets: Dict[str, Path], data: Path) -> None:
    """Every stage whose output WORK lacks (a call cut short resumes at the stage it was in)."""
    args.work.mkdir(parents=True, exist_ok=True)
    if args.data is None and not (args.work / "distill.done").is_file():
        specdraft_stage(["distill-data", str(args.recipe), f"distill.output_dir={data}", *args.overrides])
        (args.work / "distill.done").write_text("")
    for name in RUNS:
        run = args.work / name
        if not (run / "train" / "train_summary.json").is_file():
            specdraft_stage(["train", str(args.recipe), f"distill.output_dir={data}",
                             f"train.output_dir={run / 'train'}", *args.overrides, *run_overrides(name, args, recipe)])
        if not (run / "export.done").is_file():
            specdraft_stage(["export", str(run / "train"), "--format", "hf", "--out", str(run / "export"), "--force"])
            (run / "export.done").write_text("")
        for set_name, prompts in sets.items():
            if not (run / f"bench-{set_name}" / "bench.json").is_file():
                specdraft_stage(bench_argv(args, run / "export", prompts, run / f"bench-{set_name}"))
        if not (run / "cache_bytes.json").is_file():
            cache = cache_bytes_by_length(run / "export", args)
            (run / "cache_bytes.json").write_text(json.dumps(cache))


def cache_bytes_by_length(export: Path, args) -> dict:
    """The export's drafter allocated for each --cache-lengths context (float32, the bench's scratch) -> {length:
    bytes of its state}, and whether they are the same at every length (a ring)."""
    from specdraft.config import RuntimeConfig
    from specdraft.runtime.bench import draft_state_bytes
    from specdraft.runtime.load import load_runtime

    runtime = load_runtime(export, RuntimeConfig(device=args.device, dtype="float32", max_len=args.context))
    engine = runtime.engine
    drafter, scratch = engine.drafter, max(shape.scratch for shape in engine.shapes)
    by_length = {}
    for length in args.cache_lengths:
        drafter.allocate(length, scratch, engine.device, engine.dtype)
        by_length[str(length)] = draft_state_bytes(drafter)
    return {"bytes_by_context": by_length, "constant_in_context": len(set(by_length.values())) == 1}


def longspec_settings(recipe_yaml: Path) -> List[str]:
    """The LongSpec settings a run trained with, as "name: value" (its window, the sinks a window reads, its offset);
    [] for full attention at true positions."""
    if not recipe_yaml.is_file():
        return []
    from omegaconf import OmegaConf

    method = OmegaConf.load(recipe_yaml).get("method") or {}
    window, offset = method.get("attention_window") or 0, method.get("position_offset") or 0
    settings = [f"attention_window: {window}", f"attention_sinks: {method.get('attention_sinks')}"] if window else []
    return settings + ([f"position_offset: {offset}"] if offset else [])


def collect_run(name: str, run: Path) -> dict:
    train = read_json(run / "train" / "train_summary.json")
    result = {"run": name, "train_steps": train.get("steps"), "sets": {}, **read_json(run / "cache_bytes.json"),
              "longspec_settings": longspec_settings(run / "train" / "recipe.yaml")}
    for set_name in SETS:
        report = read_json(run / f"bench-{set_name}" / "bench.json")
        greedy = (report.get("runs") or [{}])[0]
        result["sets"][set_name] = {"tau": report.get("tau"), "lossless_float32": report.get("lossless_float32"),
                                    "tokens_per_s": report.get("tokens_per_s"),
                                    "speedup_vs_plain": report.get("speedup_vs_plain"),
                                    "prompts": greedy.get("prompts"), "tau_by_context": greedy.get("tau_by_context")}
    taus = [result["sets"][s]["tau"] for s in ("1k", "long")]
    result["keeps"] = taus[1] / taus[0] if None not in taus and taus[0] else None
    return result


def table(report: dict) -> str:
    lengths = report["cache_lengths"]
    rows = []
    for r in report["runs"]:
        sets = r["sets"]
        buckets = "; ".join(f"{s} {b['bucket']} {b['tau']:.2f}" for s in ("1k", "long")
                            for b in sets[s].get("tau_by_context") or [])
        memory = r.get("bytes_by_context") or {}
        rows.append([r["run"], ", ".join(r["longspec_settings"]) or "full attention", fmt(sets["1k"]["tau"], ".3f"),
                     fmt(sets["long"]["tau"], ".3f"), fmt(None if r["keeps"] is None else 100 * r["keeps"], ".1f"),
                     buckets, f"{sets['1k']['lossless_float32']}/{sets['long']['lossless_float32']}",
                     " / ".join(fmt(memory.get(str(n)) and memory[str(n)] / 2 ** 20, ".2f") for n in lengths)])
    spans = {name: "-".join(map(str, span)) for name, span in report["prompt_tokens"].items()}
    header = ["head", "settings", f"τ {spans.get('1k', '1k')}-token prompts",
              f"τ {spans.get('long', 'long')}-token prompts", "keeps %", "τ by prompt length (set, bucket)",
              "lossless (1K/long, float32)", "draft cache MiB at " + " / ".join(map(str, lengths))]
    return markdown_table(header, rows) + "\n\n" + goal_line(report["runs"])


def goal_line(runs: List[dict]) -> str:
    """Whether longspec keeps its τ within 5% on the long prompts, and full loses more."""
    keeps = {r["run"]: r["keeps"] for r in runs}
    if None in keeps.values():
        return "goal: not measured (a bench is missing)"
    held = keeps["longspec"] >= 0.95 and keeps["full"] < keeps["longspec"]
    return (f"goal (longspec keeps >= 95% of its 1K τ, full less): {'met' if held else 'NOT met'} "
            f"(longspec {100 * keeps['longspec']:.1f}%, full {100 * keeps['full']:.1f}%)")


def main(argv=None) -> dict:
    args = parse_args(argv)
    recipe = resolved_recipe(args)
    data = args.data or args.work / "data"
    sets = prompt_sets(args, recipe) if not args.collect else \
        {name: (args.prompts or args.work / "prompts") / file for name, file in SETS.items()}
    if not args.collect:
        run_stages(args, recipe, sets, data)
    lengths = {name: [json.loads(line)["token_length"] for line in path.read_text().splitlines() if line.strip()]
               for name, path in sets.items() if path.is_file()}
    report = {"machine": machine(None if args.device == "auto" else args.device), "recipe": str(args.recipe),
              "overrides": args.overrides, "data": str(data), "window": args.window, "sinks": args.sinks,
              "context": args.context, "cache_lengths": args.cache_lengths,
              "prompt_tokens": {name: [min(v), max(v)] for name, v in lengths.items() if v},
              "runs": [collect_run(name, args.work / name) for name in RUNS]}
    return finish(table(report), args.work, report, "long_context")


if __name__ == "__main__":
    main()
