"""C2T suite: the C2T path end to end over a trained EAGLE-3 export on one GPU, and the table of its goal
(docs/benchmarks.md): verified tokens a cycle, τ and tokens/s of the pruned against the unpruned tree.

    python -m tools.bench.c2t EXPORT --target $GGUF --train-prompts c2t_prompts.jsonl --mt-bench mt_bench.jsonl \\
        --spec-bench DIR --work $HOME/c2t --out $OUT

1. traces: `specdraft distill-data` of a C2T recipe over EXPORT (its method.draft) on the first --num-train
   prompts of --train-prompts (MT-bench-style chat prompts, none of MT-bench's: tools/prepare_prompts.py writes
   them), --trace-tokens new tokens each; with --traces shape (the default) one classifier a shape of --shapes,
   from that shape's own trees, every candidate its budget verifies labelled (method.trace_budget), up to
   --negatives-per-positive rejected ones a tree kept (the default keeps them all, so that the classifier's score
   reads as the chance of acceptance and β is one: about 0.01-0.05); with --traces expansion (the paper's) one
   classifier for every shape, from trees of --trace-depth x --trace-topk with every candidate verified, the
   classes balanced (β about 0.3-0.7);
2. `specdraft train`: --train-steps steps of Adam at --lr on batches of about --batch-candidates traced candidates
   (the paper's 1,024; its 10 epochs are for far more traces than a suite records: 10 epochs of these would be
   under 100 steps), the held-out recall, positive rate and AUC of the best snapshot; `specdraft export`. A
   classifier of every verified candidate needs the steps (its low probabilities resolve slowly: after 1,000 steps
   at 1e-3 its held-out AUC was still rising);
3. MT-bench (--mt-bench, --max-prompts): for the first tree shape of --shapes, the unpruned tree, then its
   classifier at each β of --betas in each place it may prune (--prune-at: selection, expansion), the verify
   holding only the kept candidates (runtime.prune_verify kept: padded to a multiple of 8 rows), and once at
   --static-beta with the budget's verify (prune_verify budget: what the sizing saves); for every larger shape
   (drafted wider and deeper, verified at a budget), the unpruned tree and each β of --large-betas (the runtime's
   default prune_at); at T=0, 256 new tokens, bf16, every run against the same plain decoding of the same run
   (`specdraft bench`'s runs: `prune_runs`); then the first shape at --beta (default: the β of its runs that prunes
   most within 2% of the unpruned τ, `pruning_beta`) in float32, speculative against plain decoding token for token
   on --lossless-prompts prompts;
4. Spec-Bench (--spec-bench: a directory of spec_bench_<task>.jsonl, tools/prepare_prompts.py): per task, its first
   --per-task prompts, the first shape unpruned and at --beta (the classifier never saw these tasks).

The table: per prompt set, tree, place and β, the tokens verified a cycle (root included; real nodes) and the
rows the verify ran (padding included), τ, tokens/s, the speedup over plain decoding, and τ, verified tokens and
tokens/s against the unpruned tree of the same shape; then the goal's checks: the first shape's run that keeps τ
within 2% with the fewest verified tokens, each larger shape pruned by C2T (at most its budget verified) against
the first shape unpruned, and per Spec-Bench task τ and verified tokens against its unpruned tree. OUT/c2t.json
(every run's summary); WORK keeps the recipe, traces, run and export.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Dict, List, Optional

from tools.bench.suite import finish, fmt, machine, markdown_table, write_report
from tools.count_cycle_launches import check_shapes, parse_shape

from specdraft.config import PRUNE_AT, RuntimeConfig

BETAS = {"shape": [0.005, 0.01, 0.012, 0.014, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05],
         "expansion": [0.3, 0.4, 0.5, 0.6, 0.7]}
"""β swept on the first shape by --traces: a classifier of every verified candidate scores about the chance of
acceptance (a (5, 8, 40) tree accepts about 5% of its nodes). Where it starts to cut depends on the classifier: on
SmolLM2's head the six extended features (the default, as recipes/c2t_smollm2.yaml) cut 15% of the verified tokens
at 0.01, 28% at 0.014 and 44% at 0.02, the paper's three 6% at 0.03 and half at 0.035; one of balanced classes
scores higher."""
LARGE_BETAS = {"shape": [0.005, 0.01, 0.015, 0.02, 0.025, 0.03], "expansion": [0.4, 0.6]}
SPEC_BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def trace_settings(args, shape: Optional[str]) -> str:
    """The recipe's trace keys: the trees of `shape` at its budget, every verified candidate kept (--traces
    shape), or --trace-depth x --trace-topk whole expansions, balanced (--traces expansion)."""
    if shape is None:
        return f"trace_depth: {args.trace_depth}, trace_topk: {args.trace_topk}"
    tree = parse_shape(shape)
    return (f"trace_depth: {tree.depth}, trace_topk: {tree.topk}, trace_budget: {tree.budget}, "
            f"negatives_per_positive: {args.negatives_per_positive:g}, threshold: {args.train_beta:g}, best_by: auc")


def write_recipe(args, work: Path, shape: Optional[str], per_batch: int = 1) -> Path:
    """The C2T recipe of one classifier (WORK/c2t.yaml): EXPORT as method.draft, the traces' (trace_settings) and
    training's settings (`per_batch` prompts a batch: written again once the traces are counted,
    `batch_prompts`)."""
    work.mkdir(parents=True, exist_ok=True)
    steps = args.train_steps
    path = work / "c2t.yaml"
    path.write_text(f"""
target: {{path: {args.target}}}
method: {{name: c2t, draft: {Path(args.export).resolve()}, features: {args.features}, {trace_settings(args, shape)}}}
data: {{prompts: [{Path(args.train_prompts_file).resolve()}], max_samples: {args.train_prompts}, max_length: 1024,
       too_long: skip, val_fraction: {args.val_fraction}}}
distill: {{output_dir: {work / 'traces'}, max_new_tokens: {args.trace_tokens}, shard_size: 16}}
train: {{output_dir: {work / 'run'}, max_steps: {steps}, micro_batch_size: {per_batch}, lr: {args.lr:g},
        warmup_steps: 1, weight_decay: 0.0, val_every_steps: {max(1, steps // 10)},
        log_every_steps: {max(1, steps // 10)}}}
""")
    return path


def batch_prompts(traces_dir: Path, candidates: int) -> int:
    """Trace rows (prompts) a batch takes for about `candidates` traced candidates, from the traces' mean."""
    from datasets import load_from_disk

    rows = load_from_disk(str(traces_dir / "dataset"))
    per_row = sum(len(labels) for labels in rows["label"]) / max(1, len(rows))
    return max(1, round(candidates / max(per_row, 1.0)))


def held_out(run_dir: Path) -> Dict:
    """The best snapshot's validation metrics (val/recall, val/positive_rate, val/auc, ...) and its step."""
    meta = json.loads((run_dir / "best" / "meta.json").read_text())
    return {"step": meta["step"], **{k.removeprefix("val/"): v for k, v in meta["metrics"].items()}}


def make_classifier(args, shape: Optional[str]) -> Dict:
    """Traces, training and export of one classifier (for `shape`'s trees, or from whole expansions: None) -> the
    export's path and each stage's seconds and counts."""
    from specdraft.distill.run import run_distill
    from specdraft.export import export_draft
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    work = Path(args.work) / (f"shape_{shape.replace(',', '_')}" if shape else "expansion")
    recipe = load_recipe(write_recipe(args, work, shape))
    started = time.perf_counter()
    counts = run_distill(recipe, device=args.device if args.device != "auto" else None)
    traced = time.perf_counter()
    per_batch = batch_prompts(Path(recipe.distill.output_dir), args.batch_candidates)
    recipe = load_recipe(write_recipe(args, work, shape, per_batch))
    summary = run_train(recipe)
    trained = time.perf_counter()
    export = export_draft(recipe.train.output_dir, "hf", work / "export", dtype="float32")
    return {"shape": shape, "export": str(export), "counts": counts, "trace_s": traced - started,
            "train_s": trained - traced, "train_steps": summary["steps"], "batch_prompts": per_batch,
            "held_out": held_out(Path(recipe.train.output_dir))}


def classifiers(args) -> Dict[str, Dict]:
    """Each shape's classifier (--traces shape), or one for all of them -> {shape: what make_classifier says, or
    {"export": --classifier}}."""
    if args.classifier is not None:
        return {shape: {"export": args.classifier} for shape in args.shapes}
    if args.traces == "expansion":
        made = make_classifier(args, None)
        return {shape: made for shape in args.shapes}
    return {shape: make_classifier(args, shape) for shape in args.shapes}


def bench_settings(args, max_prompts: Optional[int], prompts: str):
    from specdraft.runtime.bench import BenchSettings

    return BenchSettings(prompts=prompts, max_prompts=max_prompts, max_new_tokens=args.max_new_tokens,
                         temperatures=(0.0,), hf_baseline=False, lossless_prompts=args.lossless_prompts)


def variant_rows(runtime, settings, prompt_set: str, shape: str, plain: list, variants) -> List[Dict]:
    """The unpruned tree, then each variant (β, prune_at, prune_verify) on one prompt set -> table rows (plain
    decoding from `plain` when full, else run once into it)."""
    from specdraft.runtime.bench import first_user_turns, prune_runs

    prompts = first_user_turns(runtime, settings.prompts, settings.max_prompts)
    runs = prune_runs(runtime, prompts, settings, plain, [None, *variants])
    unpruned = runs[0]
    return [{"prompts": prompt_set, "shape": shape, "beta": run["prune_threshold"], "prune_at": run["prune_at"],
             "prune_verify": run["prune_verify"], "verified_per_cycle": run["verified_per_cycle"],
             "verify_rows_per_cycle": run["verify_rows_per_cycle"], "tau": run["tau"],
             "tokens_per_s": run["tokens_per_s"], "tokens_per_s_plain": run["tokens_per_s_plain"],
             "speedup_vs_plain": run["speedup_vs_plain"], "tau_vs_unpruned": run["tau"] / unpruned["tau"],
             "verified_vs_unpruned": run["verified_per_cycle"] / unpruned["verified_per_cycle"],
             "tokens_per_s_vs_unpruned": run["tokens_per_s"] / unpruned["tokens_per_s"],
             "lossless_bf16_prompts": run["lossless_prompts"], "prompt_count": run["prompts"],
             "acceptance_by_position": run["acceptance_by_position"]} for run in runs]


def first_shape_variants(args) -> List[tuple]:
    """The first shape's pruned runs: each place of --prune-at at each β of --betas, the verify sized to what is
    kept; then --static-beta with the budget's verify (the runtime's default place)."""
    variants = [(beta, place, "kept") for place in args.prune_at for beta in args.betas]
    if args.static_beta is not None:
        variants.append((args.static_beta, RuntimeConfig.prune_at, "budget"))
    return variants


def run_benches(args, exports: Dict[str, str]) -> Dict:
    """Step 3 and 4 of the module docstring over each shape's C2T export -> {rows, lossless_float32}."""
    from specdraft.runtime.bench import BenchSettings, first_user_turns, lossless_in_float32
    from specdraft.runtime.load import build_runtime, load_parts

    rows, plain_mt, loaded = [], [], {}

    def runtime_of(text, dtype=args.dtype, beta=None):
        shape, key = parse_shape(text), (exports[text], dtype)
        if key not in loaded:  # one load a classifier and dtype (the runtimes copy the target's weights)
            loaded[key] = load_parts(exports[text], RuntimeConfig(device=args.device, dtype=dtype), args.target)
        return build_runtime(*loaded[key], RuntimeConfig(depth=shape.depth, topk=shape.topk, budget=shape.budget,
                                                   max_len=args.max_len, device=args.device, dtype=dtype,
                                                   prune_threshold=beta))
    mt_settings = bench_settings(args, args.max_prompts, args.mt_bench)
    for index, text in enumerate(args.shapes):
        variants = first_shape_variants(args) if index == 0 else [
            (beta, RuntimeConfig.prune_at, "kept") for beta in args.large_betas]
        rows += variant_rows(runtime_of(text), mt_settings, "MT-bench", text, plain_mt, variants)
    first = runtime_of(args.shapes[0])
    beta = pruning_beta(rows, args) if args.beta is None else args.beta
    for task in args.tasks:
        settings = bench_settings(args, args.per_task, str(Path(args.spec_bench) / f"spec_bench_{task}.jsonl"))
        rows += variant_rows(first, settings, f"Spec-Bench {task}", args.shapes[0], [],
                             [(beta, RuntimeConfig.prune_at, "kept")])
    check = None
    if args.lossless_prompts > 0:
        float32 = runtime_of(args.shapes[0], "float32", beta)
        prompts = first_user_turns(float32, args.mt_bench, args.lossless_prompts)
        check = lossless_in_float32(float32, prompts, BenchSettings(max_new_tokens=args.max_new_tokens,
                                                                    lossless_prompts=args.lossless_prompts), None)
    return {"rows": rows, "lossless_float32": check}


def pruning_beta(rows: List[Dict], args) -> float:
    """The β of the Spec-Bench rows and the float32 check when --beta is not given: the first shape's MT-bench run
    (in the runtime's default place) that prunes most while keeping τ within 2% of its unpruned tree; else, where
    none prunes within 2%, the smallest β that prunes at all; else the middle of --betas."""
    runs = [row for row in rows if row["shape"] == args.shapes[0] and row["beta"] is not None
            and (row["prune_at"], row["prune_verify"]) == (RuntimeConfig.prune_at, "kept")]
    pruning = [row for row in runs if row["verified_vs_unpruned"] < 1.0]
    best = fewest_verified_within(pruning)
    if best is not None:
        return best["beta"]
    if pruning:
        return min(row["beta"] for row in pruning)
    return sorted(args.betas)[len(args.betas) // 2]


def fewest_verified_within(runs: List[Dict]) -> Optional[Dict]:
    """Of pruned runs, the one that verifies the fewest tokens while keeping τ within 2% of its unpruned tree (the
    goal's), or None."""
    within = [row for row in runs if row["beta"] is not None and row["tau_vs_unpruned"] >= 0.98]
    return min(within, key=lambda row: row["verified_per_cycle"]) if within else None


def goal_lines(rows: List[Dict], shapes: List[str], check: Optional[Dict]) -> List[str]:
    """The goal's checks, read off the rows."""
    mt = [row for row in rows if row["prompts"] == "MT-bench"]
    first = [row for row in mt if row["shape"] == shapes[0]]
    unpruned = next((row for row in first if row["beta"] is None), None)
    lines = [first_shape_line(first, unpruned, shapes[0])] if unpruned else []
    for shape in shapes[1:]:
        lines.append(larger_shape_line([row for row in mt if row["shape"] == shape], unpruned, shape, shapes[0]))
    for task in sorted({row["prompts"] for row in rows} - {"MT-bench"}):
        pruned = [row for row in rows if row["prompts"] == task and row["beta"] is not None]
        lines += [f"- {task}, β={row['beta']:g}: τ {100 * (row['tau_vs_unpruned'] - 1):+.1f}%, verified tokens "
                  f"{100 * (row['verified_vs_unpruned'] - 1):+.1f}% against its unpruned tree" for row in pruned]
    if check is not None:
        lines.append(f"- float32, tree {shapes[0]} pruned, speculative == plain: {check['identical']}/"
                     f"{check['prompts']} prompts")
    return lines


def first_shape_line(first: List[Dict], unpruned: Dict, shape: str) -> str:
    """The first shape's pruned run that keeps τ within 2% of its unpruned tree with the fewest verified tokens."""
    best = fewest_verified_within(first)
    if best is None:
        return f"- tree {shape}: no β keeps τ within 2% of the unpruned tree's"
    return (f"- tree {shape}, {variant_name(best)} β={best['beta']:g}: τ {100 * (best['tau_vs_unpruned'] - 1):+.1f}% "
            f"(goal within 2%), verified tokens {100 * (best['verified_vs_unpruned'] - 1):+.1f}% (goal <= -25%; "
            f"{best['verify_rows_per_cycle']:.1f} rows a verify), tokens/s "
            f"{100 * (best['tokens_per_s_vs_unpruned'] - 1):+.1f}% (goal >= 0)")


def larger_shape_line(larger: List[Dict], unpruned: Optional[Dict], shape: str, first_shape: str) -> str:
    """A larger shape's pruned run with the best τ among those verifying at most the first shape's unpruned tokens,
    against that tree."""
    if unpruned is None:
        return f"- tree {shape}: no unpruned {first_shape} to compare with"
    fitting = [row for row in larger if row["beta"] is not None
               and row["verified_per_cycle"] <= unpruned["verified_per_cycle"] + 1e-9]
    if not fitting:
        return f"- tree {shape}: no β verifies as few tokens as {first_shape} unpruned"
    best = max(fitting, key=lambda row: row["tau"])
    own = next((row for row in larger if row["beta"] is None), None)
    unpruned_own = f"; {shape} unpruned: τ {own['tau']:.3f} at {own['verified_per_cycle']:.1f}" if own else ""
    return (f"- tree {shape} pruned at β={best['beta']:g} verifies {best['verified_per_cycle']:.1f} tokens a cycle "
            f"(<= {unpruned['verified_per_cycle']:.1f}) at τ {best['tau']:.3f} "
            f"({100 * (best['tau'] / unpruned['tau'] - 1):+.1f}%; goal > 0) against {unpruned['tau']:.3f} for "
            f"{first_shape} unpruned, {best['speedup_vs_plain']:.2f}× plain against "
            f"{unpruned['speedup_vs_plain']:.2f}×{unpruned_own}")


def variant_name(row: Dict) -> str:
    """Where a run pruned and what it verified ("expansion/kept"), or "unpruned"."""
    return "unpruned" if row["beta"] is None else f"{row['prune_at']}/{row['prune_verify']}"


def classifier_line(made: Dict) -> str:
    """The classifier's traces, training and held-out metrics (at β = method.threshold) in one line."""
    held, counts = made["held_out"], made["counts"]
    trees = f"{made['shape']}'s trees" if made["shape"] else "whole expansions"
    return (f"- classifier ({trees}): traces of {counts['ok']} prompts in {made['trace_s']:.0f} s, {made['train_steps']} steps "
            f"of {made['batch_prompts']} prompts' candidates in {made['train_s']:.0f} s; held out (best, step "
            f"{held['step']}): recall {held.get('recall', float('nan')):.3f}, positive rate "
            f"{held.get('positive_rate', float('nan')):.3f}, AUC {held.get('auc', float('nan')):.3f}")


def c2t_table(rows: List[Dict]) -> str:
    return markdown_table(
        ["prompts", "tree", "β", "verified/cycle", "verify rows", "pruned at / verify", "τ", "spec tok/s", "× plain",
         "τ vs unpruned", "verified vs unpruned", "tok/s vs unpruned", "bf16 == plain"],
        [[row["prompts"], row["shape"], "unpruned" if row["beta"] is None else f"{row['beta']:g}",
          f"{row['verified_per_cycle']:.2f}", fmt(row["verify_rows_per_cycle"], ".1f"), variant_name(row),
          f"{row['tau']:.3f}", fmt(row["tokens_per_s"], ",.1f"), fmt(row["speedup_vs_plain"], ".3f"),
          f"{100 * (row['tau_vs_unpruned'] - 1):+.1f}%", f"{100 * (row['verified_vs_unpruned'] - 1):+.1f}%",
          f"{100 * (row['tokens_per_s_vs_unpruned'] - 1):+.1f}%",
          f"{row['lossless_bf16_prompts']}/{row['prompt_count']}"] for row in rows])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="C2T end to end over an EAGLE-3 export: traces, training, benches")
    parser.add_argument("export", help="the EAGLE-3 (or PosS) export the classifier prunes the trees of")
    parser.add_argument("--target", required=True, help="the target (SmolLM2's GGUF); also its bench target")
    parser.add_argument("--train-prompts-file", "--train-prompts", dest="train_prompts_file", required=True,
                        help="MT-bench-style chat prompts for the traces (tools/prepare_prompts.py)")
    parser.add_argument("--mt-bench", required=True, help="MT-bench's question.jsonl (80 prompts)")
    parser.add_argument("--spec-bench", default=None, help="a directory of spec_bench_<task>.jsonl (none: skipped)")
    parser.add_argument("--work", default="runs/c2t_suite")
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--num-train", dest="train_prompts", type=int, default=40,
                        help="prompts traced (64 took 155 s on an H200; the classifier has 241 parameters)")
    parser.add_argument("--trace-tokens", type=int, default=128, help="new tokens a traced prompt")
    parser.add_argument("--traces", choices=("shape", "expansion"), default="shape",
                        help="shape: each shape's classifier from its own trees' verified candidates; expansion: "
                             "one from whole expansions of --trace-depth x --trace-topk (module docstring)")
    parser.add_argument("--trace-depth", type=int, default=11, help="with --traces expansion")
    parser.add_argument("--trace-topk", type=int, default=10, help="with --traces expansion")
    parser.add_argument("--negatives-per-positive", type=float, default=1000.0,
                        help="with --traces shape: rejected candidates kept a tree per accepted one")
    parser.add_argument("--train-beta", type=float, default=0.014,
                        help="with --traces shape: the β training's recall is read at, the export's own "
                             "(method.threshold)")
    parser.add_argument("--features", choices=("paper", "extended"), default="extended",
                        help="what the classifiers read of a candidate (method.features)")
    parser.add_argument("--train-steps", type=int, default=4000,
                        help="optimizer steps of the classifier (about 10 s a thousand on a GPU)")
    parser.add_argument("--lr", type=float, default=3e-3, help="the classifier's Adam learning rate")
    parser.add_argument("--batch-candidates", type=int, default=1024,
                        help="traced candidates a training batch (about: whole prompts' traces)")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--shapes", nargs="+", default=["5,8,40", "7,9,40", "6,10,60"],
                        help="tree shapes DEPTH,TOPK,BUDGET; the first is the baseline of the goal's checks; the "
                             "others draft larger trees, pruned to at most a budget (the defaults draft in 64 and 61 "
                             "scratch slots: 64 is the most the Triton tree attention takes)")
    parser.add_argument("--betas", type=float, nargs="+", default=None,
                        help="β swept on the first shape in each place of --prune-at (default: BETAS of --traces)")
    parser.add_argument("--prune-at", nargs="+", default=["selection"], choices=PRUNE_AT,
                        help="where the classifier prunes in the first shape's runs (runtime.prune_at)")
    parser.add_argument("--static-beta", type=float, default=None,
                        help="one first-shape run at this β verifying the budget's rows (runtime.prune_verify "
                             "budget): what verifying only the kept candidates saves (a negative value: none; "
                             "default: the middle of --betas)")
    parser.add_argument("--large-betas", type=float, nargs="+", default=None,
                        help="β swept on the larger shapes (default: LARGE_BETAS of --traces)")
    parser.add_argument("--beta", type=float, default=None,
                        help="β of the float32 check and the Spec-Bench rows (default: pruning_beta, read off the "
                             "first shape's runs)")
    parser.add_argument("--max-prompts", type=int, default=80, help="MT-bench prompts")
    parser.add_argument("--per-task", type=int, default=5, help="Spec-Bench prompts a task")
    parser.add_argument("--tasks", nargs="+", default=list(SPEC_BENCH_TASKS))
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--lossless-prompts", type=int, default=10)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--classifier", default=None, help="a C2T export to bench instead of making one")
    args = parser.parse_args(argv)
    check_shapes(parser, args.shapes)
    if any(parse_shape(text).topk == 1 for text in args.shapes):
        parser.error("--shapes are trees: DEPTH,TOPK,BUDGET")
    if args.spec_bench is None:
        args.tasks = []
    args.betas = args.betas or BETAS[args.traces]
    args.large_betas = args.large_betas or LARGE_BETAS[args.traces]
    middle = sorted(args.betas)[len(args.betas) // 2]
    args.static_beta = middle if args.static_beta is None else args.static_beta
    if args.static_beta < 0:
        args.static_beta = None
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    report = {"export": str(args.export), "settings": {k: v for k, v in vars(args).items()}}
    started = time.perf_counter()
    made = classifiers(args)
    report["classifiers"] = made
    write_report(args.out, report, "c2t")
    results = run_benches(args, {shape: entry["export"] for shape, entry in made.items()})
    report.update(results, machine=machine(None if args.device == "auto" else args.device),
                  seconds=time.perf_counter() - started)
    lines = goal_lines(results["rows"], args.shapes, results["lossless_float32"])
    trained = {id(entry): entry for entry in made.values() if "counts" in entry}  # one line a classifier
    lines[:0] = [classifier_line(entry) for entry in trained.values()]
    table = c2t_table(results["rows"]) + "\n\n" + "\n".join(lines)
    report["goal"] = lines
    return finish(table, args.out, report, "c2t")


if __name__ == "__main__":
    main()
