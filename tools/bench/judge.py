"""Judge suite: learned acceptance beside a trained draft, end to end, with its quality cost measured. Labels are
mined on the task suite's training templates (`specdraft distill-data` with recipes/judge_smollm2.yaml: each
mismatch branched and checked), the head is fitted (`train`) and exported and scored on the labels of its
validation prompts (the δ reaching each --precision-targets there joins the sweep), then `specdraft bench` runs
the held-out templates at T=0: exact acceptance, then each δ of the sweep, each against plain decoding in the
same run, every answer checked by its program. Everything runs in float32 unless --dtype says otherwise: there
exact decoding is plain decoding token for token, so a lost answer is the judge's doing (in bf16 a verify's
rounding flips near-tied argmaxes, which alone cost a few percent of retained accuracy).

    python3 -m tools.bench.judge $HOME/work/eagle3/export --target $GGUF --work $HOME/judge --out $OUT
    python3 -m tools.bench.judge EXPORT --target $GGUF --train-prompts tasks:train:200 --thresholds 0.5 0.9 ...
    python3 -m tools.bench.judge EXPORT --target $GGUF --shape 5,8,40 6 8 --work W --out OUT   # and two chains
    python3 -m tools.bench.judge runs/eagle3_qwen25coder15b/export --recipe recipes/judge_qwen25coder15b.yaml \
        --heldout-prompts humaneval:heldout gsm8k:.data/gsm8k/test.jsonl:0..100 tasks:heldout:100 ...

EXPORT is the draft the judge serves beside (an EAGLE-3, PosS or Kangaroo export of the same target); key=value
arguments override the judge recipe (every stage). --train-prompts (default: the recipe's data.prompts) and
--heldout-prompts take prompt sets of checked items (specdraft.data.task_sets: `tasks:SPLIT[:RANGE]`,
`humaneval:SPLIT[:RANGE]`, `gsm8k:FILE[:RANGE]`, or files of records that carry a check); a held-out prompt that
is also a training prompt stops the suite before it mines. The table has, per acceptance rule: τ, τ against the exact
rule's, tokens/s, speedup over plain decoding, precision and recall on the held-out labels, plain and judged
accuracy, retained accuracy (the share of the prompts plain decoding solves that the rule still solves), answers
identical to plain decoding, and lossless. Above it: the labels mined (prompts labelled of those given,
positives, negatives, checks that failed), the head's validation accuracy, recall and specificity, its scores'
percentiles on positives and negatives and the δ chosen per precision target, the dtype; below it the float32
check of exact decoding and the goal (the highest τ ratio at a retained accuracy of at least 98%). With several
--shape entries the same head is benched at each (the float32 check on the first): below, each other shape's exact τ,
every δ's τ ratio and retained accuracy, and its goal (a chain may leave the judge more to accept than a wide tree,
whose other children often hold the target's token already). WORK/judge.json (or --out).

--rounds N (N > 1) adds on-policy rounds (DAgger-style): round k mines the same training prompts with round k-1's
judge deciding acceptance in the mining runs (`method.mine_judge`, at δ = --mine-threshold), so that the labels
judge the states judge decoding reaches, trains a head on every round's labels so far, exports it and benches it on
the first shape at round 1's sweep (and the δ its own precision targets choose), under WORK/roundK. Below the
table: each later round's labels (unrecoverable mismatches among them) and, per δ, every round's τ ratio, retained
accuracy and label precision side by side.

Several --heldout-prompts sets (say HumanEval's held-out problems, GSM8K test items and the held-out templates)
are benched one by one at the first --shape, each against plain decoding on its own prompts (the first set also at
every other shape, and the float32 check on it): below the table, each set's exact τ, per δ its τ ratio and
retained accuracy, its goal, and the sets pooled (τ over every cycle, retained accuracy over every prompt plain
decoding solves) with the pooled goal. WORK/bench holds the first set's bench, WORK/bench-setK the K-th's.

--template-labels PROMPTS (say tasks:heldout:100..600: the held-out templates' items past the bench's first 100)
mines labels there too, with exact acceptance, and scores each round's head on them: precision and recall on
templates no label it trained on came from, beside its validation labels'. A head whose precision holds on its
validation labels but not on these has learned its templates, not the task.

--resume keeps what an earlier call left in WORK (each round's export, each bench.json; distill-data resumes its
labels by itself), so that a suite longer than one call's time limit goes on where the last call stopped when the
same command runs again.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Dict, List, Optional

from tools.bench.suite import REPO, finish, fmt, machine, markdown_table, read_json, specdraft_stage, split_overrides
from tools.count_cycle_launches import check_shapes, parse_shape

import torch

from specdraft.core.io import write_json

GOAL_RETAINED = 0.98
THRESHOLDS = [0.5, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999]
PRECISION_TARGETS = [0.99, 0.995]
MINE_THRESHOLD = 0.9


def _cli(argv: List[str], seconds: Dict[str, float]) -> None:
    """`specdraft ARGV` in this process (suite.specdraft_stage), its wall time kept under its command's name."""
    started = time.perf_counter()
    specdraft_stage(argv)
    seconds[argv[0]] = time.perf_counter() - started


def shape_flags(text: str) -> List[str]:
    """'DEPTH,TOPK,BUDGET' (a tree) or 'DEPTH' (a chain) -> bench flags."""
    shape = parse_shape(text)
    if shape.topk == 1:
        return ["--chain", "--depth", str(shape.depth)]
    return ["--depth", str(shape.depth), "--topk", str(shape.topk), "--budget", str(shape.budget)]


def run_stages(args, work: Path) -> Dict[str, float]:
    """Every round's stages (`run_round`) -> each stage's seconds (a later round's prefixed with `round K`)."""
    seconds: Dict[str, float] = {}
    for number in range(1, args.rounds + 1):
        stages = run_round(args, work, number)
        seconds.update(stages if number == 1 else {f"round {number} {name}": value for name, value in stages.items()})
        write_json(work / "stage_seconds.json", seconds)
    return seconds


def round_dir(work: Path, number: int) -> Path:
    """Where a round's labels, run, export and bench go: WORK for the first, WORK/roundK after it."""
    return work if number == 1 else work / f"round{number}"


def round_overrides(args, work: Path, number: int) -> List[str]:
    """The judge recipe's overrides for one round: round 1 mines with exact acceptance; round k > 1 with round
    k-1's judge at --mine-threshold, and trains on every round's labels so far."""
    out = round_dir(work, number)
    target = [f"target.path={args.target}"] if args.target else []
    prompts = [f"data.prompts=[{','.join(args.train_prompts)}]"] if args.train_prompts else []
    overrides = [f"method.draft={args.export}", *prompts, f"distill.output_dir={out / 'labels'}",
                 f"train.output_dir={out / 'train'}", f"distill.max_new_tokens={args.max_new_tokens}",
                 f"target.dtype={args.dtype}", *target, *args.overrides]
    if number > 1:
        earlier = ",".join(str(round_dir(work, k) / "labels") for k in range(1, number))
        overrides += [f"method.mine_judge={round_dir(work, number - 1) / 'export'}",
                      f"method.mine_threshold={args.mine_threshold}", f"train.extra_distilled=[{earlier}]"]
    return overrides


def run_round(args, work: Path, number: int) -> Dict[str, float]:
    """distill-data (mined labels), train, export, the head on its held-out labels (the δ of each precision
    target joins the sweep), then bench on the held-out prompts -> each stage's seconds. Round 1 benches the first
    set at every --shape; a later round at the first, at round 1's sweep and its own chosen δ; every other set is
    benched at the first shape."""
    out, overrides = round_dir(work, number), round_overrides(args, work, number)
    seconds: Dict[str, float] = {}
    _cli(["distill-data", str(args.recipe), *overrides], seconds)  # resumes by itself
    if not (args.resume and (out / "export" / "config.json").is_file()):
        _cli(["train", str(args.recipe), *overrides], seconds)
        _cli(["export", str(out / "train"), "--format", "hf", "--out", str(out / "export")], seconds)
    first_sweep = [] if number == 1 else sweep(args.thresholds, read_json(work / "heldout_labels.json"))
    labels = heldout_labels(out, sorted({*args.thresholds, *first_sweep}), args.precision_targets)
    write_json(out / "heldout_labels.json", labels)
    thresholds = sorted({*first_sweep, *sweep(args.thresholds, labels)})
    if args.template_labels:
        if number == 1:
            mined: Dict[str, float] = {}
            _cli(["distill-data", str(args.recipe), *overrides, f"data.prompts=[{args.template_labels}]",
                  f"distill.output_dir={work / 'template_labels'}"], mined)
            seconds["template labels"] = mined["distill-data"]
        write_json(out / "template_labels.json", template_labels(out, work / "template_labels", thresholds))
    for index, shape in enumerate(args.shape if number == 1 else args.shape[:1]):  # float32 check: round 1's first
        lossless = args.lossless_prompts if index == 0 and number == 1 else 0
        stage = bench_stage(args, out, args.heldout_prompts[0], shape, bench_dir(out, index, shape), thresholds,
                            lossless)
        seconds["bench" if index == 0 else f"bench {shape}"] = stage
    for index, prompts in enumerate(args.heldout_prompts[1:], start=1):  # the other sets: the first shape
        seconds[f"bench set {index + 1}"] = bench_stage(args, out, prompts, args.shape[0], set_dir(out, index),
                                                        thresholds, 0)
    return seconds


def bench_stage(args, out: Path, prompts: str, shape: str, where: Path, thresholds: List[float],
                lossless: int) -> float:
    """`specdraft bench` of the round's export on one held-out prompt set at one shape, every δ of the sweep,
    answers checked -> its seconds (0 for one --resume keeps)."""
    if args.resume and (where / "bench.json").is_file():
        return 0.0
    bench = ["bench", str(out / "export"), "--prompts", prompts, "--check-answers", "--temperature", "0", "--no-hf",
             "--max-new-tokens", str(args.max_new_tokens), "--lossless-prompts", str(lossless), "--dtype",
             args.dtype, "--judge-threshold", *map(str, thresholds), *shape_flags(shape), "--out", str(where)]
    stage: Dict[str, float] = {}
    _cli([*bench, *(["--target", args.target] if args.target else [])], stage)
    return stage["bench"]


def set_dir(work: Path, index: int) -> Path:
    """Where the bench of the index-th --heldout-prompts set writes: WORK/bench for the first, WORK/bench-setK (K =
    index + 1) after it."""
    return work / ("bench" if index == 0 else f"bench-set{index + 1}")


def bench_dir(work: Path, index: int, shape: str) -> Path:
    """Where the bench of --shape's index-th shape writes: WORK/bench for the first, WORK/bench-SHAPE after it."""
    return work / ("bench" if index == 0 else f"bench-{shape}")


def heldout_labels(work: Path, thresholds: List[float], precision_targets: List[float]) -> dict:
    """The trained head on the labels of its validation prompts (the train stage's split): scores of positives
    and negatives, precision and recall at each δ, and the δ that reaches each precision target on them."""
    from specdraft.methods.judge import judge_collate
    from specdraft.recipes import load_recipe
    from specdraft.train.data import load_distilled, split_distilled

    recipe = load_recipe(work / "train" / "recipe.yaml")
    dirs = [recipe.distill.output_dir, *recipe.train.extra_distilled]
    dataset = load_distilled(dirs, all_columns=True)
    _, val_idx = split_distilled(dirs, len(dataset), recipe.data.val_fraction, recipe.train.seed)
    return label_report(work, judge_collate(list(dataset.select(val_idx))), thresholds, precision_targets)


def template_labels(work: Path, labels_dir: Path, thresholds: List[float]) -> dict:
    """The trained head on every label of `labels_dir` (mined on --template-labels: templates no training label
    came from), as `heldout_labels` reports its validation labels."""
    from specdraft.methods.judge import judge_collate
    from specdraft.train.data import load_distilled

    batch = judge_collate(list(load_distilled([labels_dir], all_columns=True)))
    return label_report(work, batch, thresholds, [])


def label_report(work: Path, batch: Dict[str, torch.Tensor], thresholds: List[float],
                 precision_targets: List[float]) -> dict:
    """WORK's trained head on a batch of labels: score percentiles per class, the curve at each δ, and the δ
    reaching each precision target."""
    from specdraft.drafts import load_draft
    from specdraft.methods.judge import LinearJudge, label_curve, threshold_for_precision

    labels = batch["labels"]
    with torch.no_grad():
        scores = LinearJudge(load_draft(work / "train").draft).scores(batch["hidden"]) if len(labels) else labels
    chosen = {str(target): threshold_for_precision(scores, labels, target) for target in precision_targets}
    positive = labels > 0.5
    return {"labels": len(labels), "positives": int(positive.sum()),
            "score_quantiles": {name: _quantiles(scores[mask]) for name, mask in
                                (("positive", positive), ("negative", ~positive))},
            "curve": label_curve(scores, labels, sorted({*thresholds, *chosen.values()})),
            "threshold_for_precision": chosen}


def _quantiles(values: torch.Tensor) -> Optional[List[float]]:
    """The 10th, 25th, 50th, 75th and 90th percentiles (None for no values)."""
    if len(values) == 0:
        return None
    return [round(float(q), 4) for q in torch.quantile(values.float(), torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9]))]


def sweep(thresholds: List[float], labels: dict) -> List[float]:
    """The δ benched: those asked for and those chosen for a precision target (below 1: 1 is exact decoding)."""
    chosen = [value for value in labels["threshold_for_precision"].values() if value < 1.0]
    return sorted({*thresholds, *chosen})


def label_stats(labels_dir: Path) -> dict:
    """What distill-data mined: prompts given and labelled, positives, negatives, failed checks."""
    from datasets import load_from_disk

    counts = read_json(labels_dir / "counts.json")
    dataset = load_from_disk(str(labels_dir / "dataset"))
    labels = [label for row in dataset["labels"] for label in row]
    unrecoverable = sum(dataset["unrecoverable"]) if "unrecoverable" in dataset.column_names else None
    return {"prompts": counts.get("input"), "labelled_prompts": counts.get("ok"), "skipped": counts.get("skipped"),
            "errors": counts.get("error"), "labels": len(labels), "positives": sum(labels),
            "negatives": len(labels) - sum(labels), "check_errors": sum(dataset["check_errors"]),
            "unrecoverable": unrecoverable}


def goal(bench: dict) -> Optional[dict]:
    """The δ with the highest τ against the exact τ among those keeping retained accuracy >= GOAL_RETAINED."""
    exact = next(run for run in bench["runs"] if run["temperature"] == 0)
    kept = [run for run in bench.get("judge_sweep") or []
            if ((run.get("answers") or {}).get("retained_accuracy") or 0) >= GOAL_RETAINED]
    if not kept:
        return None
    best = max(kept, key=lambda run: run["tau"])
    return {"judge_threshold": best["judge_threshold"], "tau_ratio": best["tau"] / exact["tau"],
            "retained_accuracy": best["answers"]["retained_accuracy"], "speedup_vs_plain": best["speedup_vs_plain"]}


def shape_summary(bench: dict) -> dict:
    """One shape's exact τ, the goal's δ and each δ's τ ratio and retained accuracy."""
    exact = next(run for run in bench["runs"] if run["temperature"] == 0)
    return {"exact_tau": exact["tau"], "goal": goal(bench),
            "sweep": [{"judge_threshold": run["judge_threshold"], "tau_ratio": run["tau"] / exact["tau"],
                       "retained_accuracy": (run.get("answers") or {}).get("retained_accuracy")}
                      for run in bench.get("judge_sweep") or []]}


def exact_run(bench: dict) -> dict:
    return next(run for run in bench["runs"] if run["temperature"] == 0)


def set_summaries(args, out: Path) -> List[dict]:
    """Each --heldout-prompts set's bench at the first shape in a round's directory: its prompts, plain decoding's
    accuracy, exact τ, goal and sweep."""
    summaries = []
    for index, prompts in enumerate(args.heldout_prompts):
        bench = read_json(set_dir(out, index) / "bench.json")
        answers = exact_run(bench).get("answers") or {}
        summaries.append({"prompts": prompts, "count": exact_run(bench)["prompts"],
                          "accuracy_plain": answers.get("accuracy_plain"), **shape_summary(bench)})
    return summaries


def _pool(runs: List[dict]) -> dict:
    """Runs on several prompt sets as one: τ over every cycle, retained accuracy over every prompt plain decoding
    solves, speedup from the summed tokens and seconds."""
    cycles = sum(run["cycles"] for run in runs)
    answers = [run.get("answers") or {} for run in runs]
    solved_plain = sum(answer.get("solved_plain", 0) for answer in answers)
    rates = {name: sum(run["new_tokens"][name] for run in runs) / max(1e-9, sum(run["seconds"][name] for run in runs))
             for name in ("spec", "plain")}
    return {"tau": sum(run["tau"] * run["cycles"] for run in runs) / cycles if cycles else None,
            "prompts": sum(run["prompts"] for run in runs), "solved_plain": solved_plain,
            "retained_accuracy": sum(answer.get("solved_both", 0) for answer in answers) / solved_plain
            if solved_plain else None, "speedup_vs_plain": rates["spec"] / rates["plain"] if rates["plain"] else None}


def pooled(benches: List[dict]) -> dict:
    """Several sets' benches (the same sweep) pooled (`_pool`): exact τ, each δ's τ ratio, retained accuracy and
    speedup, and the goal (the highest pooled τ ratio at a pooled retained accuracy of at least GOAL_RETAINED)."""
    exact = _pool([exact_run(bench) for bench in benches])
    sweep = []
    for number, run in enumerate(benches[0].get("judge_sweep") or []):
        point = _pool([bench["judge_sweep"][number] for bench in benches])
        sweep.append({"judge_threshold": run["judge_threshold"], **point,
                      "tau_ratio": point["tau"] / exact["tau"] if point["tau"] and exact["tau"] else None})
    kept = [point for point in sweep if (point["retained_accuracy"] or 0) >= GOAL_RETAINED]
    best = max(kept, key=lambda point: point["tau_ratio"] or 0) if kept else None
    goal_point = None if best is None else {key: best[key] for key in ("judge_threshold", "tau_ratio",
                                                                       "retained_accuracy", "speedup_vs_plain")}
    return {"exact_tau": exact["tau"], "prompts": exact["prompts"], "solved_plain": exact["solved_plain"],
            "sweep": sweep, "goal": goal_point}


def sets_report(args, out: Path) -> dict:
    """A round's held-out sets one by one and pooled ({} with one set: the main table is all of it)."""
    if len(args.heldout_prompts) < 2:
        return {}
    benches = [read_json(set_dir(out, index) / "bench.json") for index in range(len(args.heldout_prompts))]
    return {"sets": set_summaries(args, out), "pooled": pooled(benches)}


def head_metrics(out: Path) -> dict:
    """A round's head on its validation labels (the train stage's best snapshot)."""
    head = read_json(out / "train" / "best" / "meta.json").get("metrics", {})
    return {name: head.get(f"val/{name}") for name in ("acc", "recall", "specificity", "balanced_acc")}


def round_summary(args, work: Path, number: int) -> dict:
    """One round on the first shape: how its labels were mined, the labels, its head, exact τ, the goal and per δ
    the τ ratio, retained accuracy and the held-out labels' precision."""
    out = round_dir(work, number)
    heldout = read_json(out / "heldout_labels.json")
    summary = shape_summary(read_json(out / "bench" / "bench.json"))
    templates = read_json(out / "template_labels.json")
    for point in summary["sweep"]:
        point["label_precision"] = _label_point(heldout, point["judge_threshold"]).get("precision")
        if templates:
            point["template_precision"] = _label_point(templates, point["judge_threshold"]).get("precision")
    mined_by = None if number == 1 else str(round_dir(work, number - 1) / "export")
    return {"round": number, "mine_judge": mined_by, "mine_threshold": None if number == 1 else args.mine_threshold,
            "labels": label_stats(out / "labels"), "head": head_metrics(out), **summary,
            "heldout_sets": sets_report(args, out)}


def collect(args, work: Path) -> dict:
    bench, seconds = read_json(work / "bench" / "bench.json"), read_json(work / "stage_seconds.json")
    others = {shape: shape_summary(read_json(bench_dir(work, index, shape) / "bench.json"))
              for index, shape in enumerate(args.shape) if index > 0}
    report = {"machine": machine(), "torch": torch.__version__, "export": str(args.export), "target": args.target,
              "train_prompts": training_prompts(args), "heldout_prompts": args.heldout_prompts, "dtype": args.dtype,
              "max_new_tokens": args.max_new_tokens, "shape": args.shape, "overrides": args.overrides,
              "labels": label_stats(work / "labels"), "heldout_labels": read_json(work / "heldout_labels.json"),
              "head": head_metrics(work), "stage_seconds": seconds, "bench": bench, "goal": goal(bench),
              "other_shapes": others, "template_labels_prompts": args.template_labels,
              "heldout_sets": sets_report(args, work)}
    if args.template_labels:
        report["template_labels"] = {"mined": label_stats(work / "template_labels"),
                                     **read_json(work / "template_labels.json")}
    if args.rounds > 1:
        report["rounds"] = [round_summary(args, work, number) for number in range(1, args.rounds + 1)]
    return report


def _label_point(heldout: dict, threshold: Optional[float]) -> dict:
    """The held-out labels' curve at δ ({} for exact decoding or a δ not on the curve)."""
    return next((p for p in heldout.get("curve") or [] if p["threshold"] == threshold), {})


def _label_cells(heldout: dict, threshold: Optional[float]) -> List[str]:
    """The held-out labels' precision and recall at δ (dashes for exact decoding or a δ not on the curve)."""
    point = _label_point(heldout, threshold)
    return [fmt(point.get("precision"), ".3f"), fmt(point.get("recall"), ".3f")]


def _heldout_line(heldout: dict) -> str:
    quantiles = heldout.get("score_quantiles") or {}
    chosen = ", ".join(f"precision {target}: δ={value:.4g}"
                       for target, value in (heldout.get("threshold_for_precision") or {}).items())
    return (f"held-out labels: {heldout.get('labels')} ({heldout.get('positives')} positive); score percentiles "
            f"10/25/50/75/90% positives {quantiles.get('positive')}, negatives {quantiles.get('negative')}; "
            f"chosen {chosen or '-'}")


def _template_lines(report: dict) -> List[str]:
    """The head on labels mined on --template-labels (templates it never trained on): precision and recall per δ
    beside those on its validation labels."""
    templates = report.get("template_labels")
    if not templates:
        return []
    heldout = report.get("heldout_labels") or {}
    rows = [[f"δ={point['threshold']:.4g}", *_label_cells(heldout, point["threshold"]),
             fmt(point["precision"], ".3f"), fmt(point["recall"], ".3f"), point["false_accepts"]]
            for point in templates["curve"]]
    return ["", f"labels mined on {report['template_labels_prompts']}: {templates['labels']} "
                f"({templates['positives']} positive) from {templates['mined']['labelled_prompts']} prompts",
            markdown_table(["", "validation labels: precision", "recall", "these labels: precision", "recall",
                            "false accepts"], rows)]


def _goal_text(reached: Optional[dict]) -> str:
    if reached is None:
        return "none of the δ keeps it"
    return (f"δ={reached['judge_threshold']:.4g}, τ {reached['tau_ratio']:.2f}x the exact τ, retained "
            f"{reached['retained_accuracy']:.3f}")


def _other_shapes(report: dict) -> List[str]:
    """A table of the other --shape entries: exact τ, each δ's τ ratio / retained accuracy, the goal."""
    others = report.get("other_shapes") or {}
    if not others:
        return []
    thresholds = [point["judge_threshold"] for point in next(iter(others.values()))["sweep"]]
    rows = [[shape, fmt(summary["exact_tau"], ".2f"),
             *(f"{point['tau_ratio']:.2f} / {fmt(point['retained_accuracy'], '.3f')}" for point in summary["sweep"]),
             _goal_text(summary["goal"])] for shape, summary in others.items()]
    return ["", markdown_table(["shape", "exact τ", *(f"δ={t:.4g}: τ ratio / retained" for t in thresholds),
                                "goal"], rows)]


def _set_lines(title: str, report: dict) -> List[str]:
    """A round's held-out sets (each at the first shape) and the sets pooled: exact τ, per δ the τ ratio and
    retained accuracy, the goal."""
    if not report:
        return []
    sets, pool = report["sets"], report["pooled"]
    thresholds = [point["judge_threshold"] for point in pool["sweep"]]

    def cells(sweep: List[dict]) -> List[str]:
        return [f"{fmt(point['tau_ratio'], '.2f')} / {fmt(point['retained_accuracy'], '.3f')}" for point in sweep]

    rows = [[one["prompts"], one["count"], fmt(one["accuracy_plain"], ".3f"), fmt(one["exact_tau"], ".2f"),
             *cells(one["sweep"]), _goal_text(one["goal"])] for one in sets]
    rows.append(["pooled", pool["prompts"], "-", fmt(pool["exact_tau"], ".2f"), *cells(pool["sweep"]),
                 _goal_text(pool["goal"])])
    return ["", title, markdown_table(["held-out set", "prompts", "plain accuracy", "exact τ",
                                       *(f"δ={t:.4g}: τ ratio / retained" for t in thresholds), "goal"], rows)]


def _round_line(summary: dict) -> str:
    """How a later round mined, what it labelled and its head."""
    labels = summary["labels"]
    return (f"round {summary['round']}, mined with {summary['mine_judge']} at δ={summary['mine_threshold']:g}: "
            f"{labels['labels']} labels ({labels['positives']} positive) from {labels['labelled_prompts']} of "
            f"{labels['prompts']} prompts, {labels['unrecoverable']} unrecoverable mismatches, "
            f"{labels['check_errors']} failed branch checks; head held out: balanced accuracy "
            f"{fmt(summary['head']['balanced_acc'], '.3f')}")


def _round_cell(summary: dict, threshold: float) -> str:
    """A round's τ ratio / retained accuracy / label precision at δ (a dash where it did not bench δ)."""
    point = next((p for p in summary["sweep"] if p["judge_threshold"] == threshold), None)
    if point is None:
        return "-"
    cell = (f"{point['tau_ratio']:.2f} / {fmt(point['retained_accuracy'], '.3f')} / "
            f"{fmt(point['label_precision'], '.3f')}")
    return cell + (f" / {fmt(point['template_precision'], '.3f')}" if "template_precision" in point else "")


def _rounds(report: dict) -> List[str]:
    """Each later round's labels, then per δ every round's τ ratio / retained accuracy / label precision, its
    exact τ and its goal (the first shape)."""
    rounds = report.get("rounds") or []
    if not rounds:
        return []
    lines = [""] + [_round_line(summary) for summary in rounds[1:]]
    thresholds = sorted({point["judge_threshold"] for summary in rounds for point in summary["sweep"]})
    rows = [["exact τ", *(fmt(summary["exact_tau"], ".2f") for summary in rounds)]]
    for threshold in thresholds:
        rows.append([f"δ={threshold:.4g}", *(_round_cell(summary, threshold) for summary in rounds)])
    rows.append(["goal", *(_goal_text(summary["goal"]) for summary in rounds)])
    templates = " / template-label precision" if report.get("template_labels") else ""
    header = ["", *(f"round {summary['round']}: τ ratio / retained / label precision{templates}"
                    for summary in rounds)]
    later_sets = [line for summary in rounds[1:] for line in
                  _set_lines(f"round {summary['round']}, held-out sets at {report['shape'][0]}:",
                             summary.get("heldout_sets") or {})]
    return [*lines, "", markdown_table(header, rows), *later_sets]


def table(report: dict) -> str:
    bench, labels, head = report["bench"], report["labels"], report["head"]
    heldout = report.get("heldout_labels") or {}
    exact = next(run for run in bench["runs"] if run["temperature"] == 0)
    rows = []
    for run in [exact, *bench["judge_sweep"]]:
        answers = run.get("answers") or {}
        name = "exact" if "judge_threshold" not in run else f"δ={run['judge_threshold']:.4g}"
        rows.append([name, fmt(run["tau"], ".2f"), fmt(run["tau"] / exact["tau"], ".2f"), fmt(run["tokens_per_s"]),
                     fmt(run["speedup_vs_plain"], ".2f"), *_label_cells(heldout, run.get("judge_threshold")),
                     fmt(answers.get("accuracy_plain"), ".3f"), fmt(answers.get("accuracy"), ".3f"),
                     fmt(answers.get("retained_accuracy"), ".3f"), f"{run['lossless_prompts']}/{run['prompts']}",
                     run["lossless"]])
    check, reached = bench.get("float32_check") or {}, report["goal"]
    lines = [f"labels: {labels['labels']} ({labels['positives']} positive, {labels['negatives']} negative) from "
             f"{labels['labelled_prompts']} of {labels['prompts']} prompts ({labels['skipped']} skipped, "
             f"{labels['errors']} errors, {labels['check_errors']} failed branch checks)",
             f"head, held out: accuracy {fmt(head['acc'], '.3f')}, recall {fmt(head['recall'], '.3f')}, "
             f"specificity {fmt(head['specificity'], '.3f')}", _heldout_line(heldout),
             f"target and draft in {bench.get('settings', {}).get('dtype', report.get('dtype'))}: accuracies and "
             f"speedups against plain decoding in the same dtype", "",
             markdown_table(["acceptance", "τ", "τ / exact", "tok/s", "speedup vs plain", "label precision",
                             "label recall", "plain accuracy", "accuracy", "retained accuracy", "identical to plain",
                             "lossless"], rows), "",
             f"exact decoding, float32: {check.get('identical')}/{check.get('prompts')} identical to plain",
             "goal (retained accuracy >= 98%): " + _goal_text(reached),
             *_set_lines(f"held-out sets at {report['shape'][0]}, each against plain decoding on its own prompts "
                         f"(the table above: the first):", report.get("heldout_sets") or {}),
             *_template_lines(report),
             *_other_shapes(report), *_rounds(report),
             "seconds: " + ", ".join(f"{stage} {value:.0f}" for stage, value in report["stage_seconds"].items())]
    return "\n".join(lines)


def _args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="judge: mined labels, the head, and τ against retained accuracy")
    parser.add_argument("export", type=Path, help="the draft the judge serves beside (an export of the target)")
    parser.add_argument("overrides", nargs="*", help="judge recipe overrides for every stage, key=value")
    parser.add_argument("--target", default=None, help="the target (default: the recipe's, the packaged SmolLM2)")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "judge_smollm2.yaml")
    parser.add_argument("--train-prompts", nargs="+", default=None,
                        help="prompt sets labels are mined on (default: the recipe's data.prompts)")
    parser.add_argument("--heldout-prompts", nargs="+", default=["tasks:heldout:100"],
                        help="prompt sets the sweep is benched on, each apart (held out: none of their prompts may be "
                             "a training prompt); say humaneval:heldout gsm8k:.data/gsm8k/test.jsonl:0..100 "
                             "tasks:heldout:100")
    parser.add_argument("--template-labels", default=None,
                        help="prompts of templates the head never trains on (say tasks:heldout:100..600, past the "
                             "bench's items): labels mined on them with exact acceptance, each round's head scored "
                             "on them beside its validation labels")
    parser.add_argument("--thresholds", type=float, nargs="+", default=THRESHOLDS)
    parser.add_argument("--precision-targets", type=float, nargs="*", default=PRECISION_TARGETS,
                        help="each adds to the sweep the δ reaching this precision on the held-out labels")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                        help="target and draft dtype of mining and the bench (float32: exact decoding is plain "
                             "decoding, so retained accuracy measures the judge alone)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--shape", nargs="+", default=["5,8,40"],
                        help="DEPTH,TOPK,BUDGET (a tree) or DEPTH (a chain); more than one: each benched with the "
                             "same head, the first in full")
    parser.add_argument("--lossless-prompts", type=int, default=10, help="exact decoding checked in float32")
    parser.add_argument("--rounds", type=int, default=1,
                        help="mining rounds: each after the first mines with the previous round's judge (on-policy) "
                             "and trains on every round's labels")
    parser.add_argument("--mine-threshold", type=float, default=MINE_THRESHOLD,
                        help="δ of the previous round's judge in a later round's mining runs")
    parser.add_argument("--work", type=Path, default=Path("runs/bench/judge"))
    parser.add_argument("--out", type=Path, default=None, help="where judge.json goes (default: WORK)")
    parser.add_argument("--collect", action="store_true", help="only read an existing WORK")
    parser.add_argument("--resume", action="store_true",
                        help="keep what an earlier, interrupted call left in WORK: a round's export (its head is not "
                             "trained again) and each bench.json (that bench is not run again); distill-data resumes "
                             "its labels by itself")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    args.shape, args.overrides = split_overrides(args.shape, args.overrides)  # and --shape
    args.heldout_prompts, args.overrides = split_overrides(args.heldout_prompts, args.overrides)  # and the lists
    if args.train_prompts:
        args.train_prompts, args.overrides = split_overrides(args.train_prompts, args.overrides)
    check_shapes(parser, args.shape)  # a bad shape stops here, not after the mining and training
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if not 0.0 <= args.mine_threshold <= 1.0:
        parser.error(f"--mine-threshold must be in [0, 1], got {args.mine_threshold}")
    return args


def shared_prompt(train: List[str], heldout: List[str]) -> Optional[str]:
    """The first held-out prompt (as 'SET item I') whose user turn is also a training prompt's, or None."""
    from specdraft.data.sources import load_conversations

    def turns(conversation) -> tuple:
        return tuple(message["content"] for message in conversation.messages if message["role"] == "user")

    seen = {turns(conversation) for conversation in load_conversations(list(train))}
    for spec in heldout:
        for conversation in load_conversations([spec]):
            if turns(conversation) in seen:
                return f"{spec} item {conversation.index}"
    return None


def training_prompts(args) -> List[str]:
    """The prompt sets labels are mined on: --train-prompts, else the recipe's data.prompts."""
    from specdraft.recipes import load_recipe

    return list(args.train_prompts or load_recipe(args.recipe, args.overrides).data.prompts)


def main(argv: Optional[List[str]] = None) -> dict:
    args = _args(argv)
    if not args.collect:
        train = training_prompts(args)
        shared = shared_prompt(train, args.heldout_prompts)
        if shared is not None:
            raise SystemExit(f"held-out prompt {shared} is also a training prompt (of {' '.join(train)}): name "
                             f"held-out items (humaneval:heldout, a GSM8K test file, tasks:heldout)")
        run_stages(args, args.work)
    report = collect(args, args.work)
    return finish(table(report), args.out or args.work, report, "judge")


if __name__ == "__main__":
    main()
