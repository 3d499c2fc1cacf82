"""ViSpec suite: a ViSpec draft against a text-only EAGLE-3 head on one vision-language target, both trained on the
same regenerated long answers, for the same steps with the same seed, and benched against plain decoding on
held-out images.

    python -m tools.bench.vispec runs/small_vlm --out runs/bench/vispec        # about 5 minutes on one H200
    python -m tools.bench.vispec runs/small_vlm --shapes 12 10,6,48 --out ...  # and at a chain of 12, a tree
    python -m tools.bench.vispec runs/small_vlm --tasks determined --out ...   # answers the image determines

VLM is a model directory whose prompt sets sit in VLM/prompts/ (distill.jsonl and test.jsonl, LLaVA's form, each
image a path relative to its JSONL; `specdraft build-small-vlm` writes both), or --prompts DIR. `--tasks determined`
trains and benches on DIR/determined/ alone: the kinds whose answers the image determines token by token (a grid of
shapes listed cell by cell, words transcribed, a bar chart's values read out: specdraft/vlm/determined.py), where a
text-only head can only guess what the image decides. In this process:
  1. lengths: the first --length-prompts distill prompts regenerated without the answer instruction, then the first
     --distill-prompts with it (recipes/vispec_smallvlm.yaml's distill.answer_instruction): the training data;
     the answer-length distribution with and without it, on the same prompts;
  2. train: ViSpec (the recipe) and EAGLE-3 (the recipe's EAGLE-3 settings) on that data, --steps steps each, one
     seed; export both;
  3. bench: each draft against plain decoding in the runtime on the first --bench-prompts test images at T=0, the
     instruction appended as in training (--plain-bench: the plain question) (τ, tokens/s, speedup; the runtime's
     dtype), then speculative against plain decoding in float32 on the first --lossless-prompts of them, token for
     token; then each draft again at each of --shapes (no float32 check), with the τ ratio of each.
Prints markdown tables and writes OUT/vispec.json (rewritten after every stage, with each stage's seconds).
Trailing key=value arguments override the recipe for every stage. Both drafts train by EAGLE-3's training-time test
(method.ttt_steps unrolled steps, each fed the draft's own states from the step before).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Dict, List, Optional

from tools.bench.suite import fmt, machine, markdown_table, split_overrides, write_report
from tools.count_cycle_launches import check_shapes, parse_shape

from specdraft.vlm.prompts import length_summary

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "vispec_smallvlm.yaml"
TASKS = ("described", "determined")


def task_prompts(folder: Path, tasks: str) -> Path:
    """The folder of the prompt sets of --tasks: FOLDER itself, or its determined/ sets."""
    from specdraft.vlm.prompts import DETERMINED

    return folder / DETERMINED if tasks == "determined" else folder


def suite_recipe(args, out: Path, method_dir: str, prompts: int, instruction: bool = True):
    """The recipe with the suite's settings: the VLM, its distill split (the first `prompts`), OUT's folders."""
    from specdraft.recipes import load_recipe

    data = out / ("data" if instruction else "data_without_instruction")
    overrides = [f"target.path={args.vlm}", f"data.prompts=[{args.prompt_dir / 'distill.jsonl'}]",
                 f"data.max_samples={prompts}", f"distill.output_dir={data}",
                 f"distill.max_new_tokens={args.max_new_tokens}", f"train.output_dir={out / method_dir / 'train'}",
                 f"train.max_steps={args.steps}", f"train.micro_batch_size={args.batch}", f"train.seed={args.seed}",
                 f"train.val_every_steps={args.steps}", *args.overrides]
    if not instruction:
        overrides.append("distill.answer_instruction=null")
    return load_recipe(args.recipe, overrides)


def eagle3_twin(recipe, out: Path):
    """The same recipe for a text-only EAGLE-3 head: EAGLE-3's share of the method section, its own train folder."""
    from specdraft.methods.eagle3 import Eagle3Config

    method = Eagle3Config(**{f.name: getattr(recipe.method, f.name) for f in dataclasses.fields(Eagle3Config)})
    train = dataclasses.replace(recipe.train, output_dir=str(out / "eagle3" / "train"))
    return dataclasses.replace(recipe, method=method, method_name="eagle3", train=train)


def answer_lengths(distill_dir: Path) -> Dict[int, int]:
    """{prompt index: answer tokens} of a distilled set (its rows' loss-mask sums: the end of turn included)."""
    from datasets import load_from_disk

    from specdraft.data.format import dataset_dir

    rows = load_from_disk(str(dataset_dir(distill_dir)))
    return {int(index): int(sum(mask)) for index, mask in zip(rows["index"], rows["loss_mask"])}


def distill_stage(args, out: Path, report: dict):
    """Regenerate without the instruction (the length check's prompts), then with it (the training data)."""
    from specdraft.distill.run import run_distill

    started = time.perf_counter()
    run_distill(suite_recipe(args, out, "vispec", args.length_prompts, instruction=False))
    recipe = suite_recipe(args, out, "vispec", args.distill_prompts)
    counts = run_distill(recipe)
    without, with_all = answer_lengths(out / "data_without_instruction"), answer_lengths(out / "data")
    paired = [with_all[index] for index in without if index in with_all]
    report["lengths"] = {"instruction": recipe.distill.answer_instruction, "max_new_tokens": args.max_new_tokens,
                         "without": length_summary(list(without.values()), args.max_new_tokens),
                         "with": length_summary(paired, args.max_new_tokens),
                         "with_all_prompts": length_summary(list(with_all.values()), args.max_new_tokens)}
    throughput = json.loads((out / "data" / "throughput.json").read_text())
    report["distill"] = {**counts, "tokens_per_s": throughput.get("tokens_per_s"),
                         "seconds": time.perf_counter() - started}
    return recipe


def train_stage(recipes: Dict[str, object], out: Path, report: dict) -> None:
    from specdraft.export import export_draft
    from specdraft.train.trainer import run_train

    for name, recipe in recipes.items():
        started = time.perf_counter()
        summary = run_train(recipe)
        export_draft(Path(recipe.train.output_dir), "hf", out / name / "export")
        report["runs"][name] = {"method": recipe.method_name, "train": summary,
                                "train_seconds": time.perf_counter() - started}


class Targets:
    """The target loaded once per dtype, shared by both drafts' runtimes."""

    def __init__(self, device: str):
        self.device, self.loaded = device, {}

    def get(self, config, dtype: str):
        from specdraft.targets import load_target

        if dtype not in self.loaded:
            self.loaded[dtype] = load_target(config, device=self.device, dtype=dtype, require_chat_template=False)
        return self.loaded[dtype]


def bench_inputs(runtime, args, instruction: Optional[str]) -> list:
    """The first --bench-prompts test prompts with their images, `instruction` (None: none) appended to each user
    turn on a line of its own, as distillation appends it."""
    from specdraft.data.images import load_images
    from specdraft.runtime.answers import bench_prompts

    turns, _, images = bench_prompts(str(args.prompt_dir / "test.jsonl"), args.bench_prompts)
    return [runtime.prompt(f"{turn}\n{instruction}" if instruction else turn, load_images(paths))
            for turn, paths in zip(turns, images)]


def shape_settings(text: Optional[str]) -> dict:
    """A --shapes entry as runtime settings ({} for None: the draft's own shape)."""
    if text is None:
        return {}
    shape = parse_shape(text)
    if shape.topk == 1:
        return {"chain": True, "depth": shape.depth}
    return {"chain": False, "depth": shape.depth, "topk": shape.topk, "budget": shape.budget}


def bench_draft(export: Path, targets: Targets, args, instruction: Optional[str], shape: Optional[str] = None,
                check: bool = True) -> dict:
    """One draft's bench at T=0 against plain decoding at `shape` (a --shapes entry; None: the draft's own), and,
    with `check`, its float32 lossless check."""
    from specdraft.drafts import load_draft
    from specdraft.runtime.bench import BenchSettings, lossless_in_float32, run_temperature
    from specdraft.runtime.load import build_runtime

    loaded = load_draft(export)
    settings = BenchSettings(prompts=str(args.prompt_dir / "test.jsonl"), max_prompts=args.bench_prompts,
                             max_new_tokens=args.bench_new_tokens, temperatures=(0.0,), hf_baseline=False,
                             lossless_prompts=args.lossless_prompts)

    def runtime_in(dtype: str):
        config = dataclasses.replace(loaded.runtime, device=args.device, dtype=dtype, max_len=args.max_len,
                                     **shape_settings(shape))
        return build_runtime(loaded, targets.get(loaded.target_config, dtype), config)

    runtime = runtime_in(args.dtype)
    prompts = bench_inputs(runtime, args, instruction)
    run = run_temperature(runtime, prompts, settings, 0.0, [])
    lossless = lossless_in_float32(runtime, prompts, settings, lambda: runtime_in("float32")) if check else None
    keys = ("tau", "acceptance_by_position", "tokens_per_s", "tokens_per_s_plain", "speedup_vs_plain", "lossless",
            "prompts", "new_tokens", "seconds")
    return {**{key: run[key] for key in keys}, "lossless_float32": lossless}


def bench_stage(out: Path, args, report: dict) -> None:
    targets = Targets(args.device)
    instruction = None if args.plain_bench else report["lengths"]["instruction"]
    report["bench_instruction"] = instruction
    for name, run in report["runs"].items():
        started = time.perf_counter()
        run["bench"] = bench_draft(out / name / "export", targets, args, instruction)
        run["bench_by_shape"] = {shape: bench_draft(out / name / "export", targets, args, instruction, shape,
                                                    check=False) for shape in args.shapes}
        run["bench_seconds"] = time.perf_counter() - started


def by_shape(runs: Dict[str, dict], shape: str) -> dict:
    """Both drafts' benches at one of --shapes and their τ ratio."""
    benches = {name: run["bench_by_shape"][shape] for name, run in runs.items()}
    ratio = benches["vispec"]["tau"] / benches["eagle3"]["tau"] if benches["eagle3"]["tau"] else None
    return {**benches, "tau_ratio": ratio}


def tables(report: dict) -> str:
    lengths = report.get("lengths", {})
    length_rows = [[label, lengths[key].get("answers"), fmt(lengths[key].get("mean"), ".0f"),
                    fmt(lengths[key].get("median"), ".0f"), fmt(lengths[key].get("p10"), ""),
                    fmt(lengths[key].get("p90"), ""), fmt(lengths[key].get("max"), ""),
                    fmt(lengths[key].get("at_limit"), ".0%")]
                   for label, key in (("without instruction", "without"), ("with, same prompts", "with"),
                                      ("with, every prompt", "with_all_prompts")) if key in lengths]
    run_rows = []
    for name, run in report.get("runs", {}).items():
        bench, check = run.get("bench", {}), (run.get("bench") or {}).get("lossless_float32") or {}
        run_rows.append([name, run["train"]["steps"], fmt(run["train"].get("best"), ".3f"),
                         fmt(bench.get("tau"), ".3f"), fmt(bench.get("tokens_per_s"), ".1f"),
                         fmt(bench.get("tokens_per_s_plain"), ".1f"), fmt(bench.get("speedup_vs_plain"), ".2f"),
                         f"{check.get('identical', '-')}/{check.get('prompts', '-')}"])
    text = markdown_table(["answers", "n", "mean", "median", "p10", "p90", "max", "at the limit"], length_rows)
    text += "\n\n" + markdown_table(["draft", "steps", "held-out τ_sim", "τ", "spec tok/s", "plain tok/s",
                                     "speedup", "float32 lossless"], run_rows)
    if "bench_instruction" in report:
        text += (f"\n\nbench prompts: {'with' if report['bench_instruction'] else 'without'} the instruction; "
                 f"tasks: {report['settings']['tasks']} ({report['settings']['prompt_dir']})")
    if report.get("tau_ratio") is not None:
        text += f"\n\nτ(ViSpec) / τ(EAGLE-3) = {report['tau_ratio']:.3f}"
    if report.get("by_shape"):
        rows = [[shape, *(fmt(by[name].get(key), form) for name in ("vispec", "eagle3")
                          for key, form in (("tau", ".3f"), ("speedup_vs_plain", ".2f"))), fmt(by["tau_ratio"], ".3f")]
                for shape, by in report["by_shape"].items()]
        text += "\n\n" + markdown_table(["shape", "ViSpec τ", "ViSpec speedup", "EAGLE-3 τ", "EAGLE-3 speedup",
                                          "τ ratio"], rows)
    return text


def _args(argv: Optional[List[str]]):
    parser = argparse.ArgumentParser(description="ViSpec against a text-only EAGLE-3 head on one VLM")
    parser.add_argument("vlm", type=Path, help="the VLM directory (`specdraft build-small-vlm`'s output)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for every stage, key=value")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/vispec"))
    parser.add_argument("--prompts", dest="prompt_dir", type=Path, default=None,
                        help="the folder of distill.jsonl and test.jsonl (default: VLM/prompts)")
    parser.add_argument("--tasks", choices=TASKS, default="described",
                        help="described: the scenes described briefly or at length (the folder's own sets); "
                             "determined: the folder's determined/ sets alone, answers the image determines token "
                             "by token (a grid listed cell by cell, words transcribed, bar values read out)")
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--distill-prompts", type=int, default=768)
    parser.add_argument("--length-prompts", type=int, default=64, help="prompts regenerated without the instruction")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16, help="training micro-batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bench-prompts", type=int, default=20)
    parser.add_argument("--bench-new-tokens", type=int, default=384)
    parser.add_argument("--plain-bench", action="store_true",
                        help="bench the test prompts as they are (default: with the instruction, as trained)")
    parser.add_argument("--lossless-prompts", type=int, default=10)
    parser.add_argument("--shapes", nargs="*", default=[],
                        help="more shapes to bench both drafts at, each DEPTH (a chain) or DEPTH,TOPK,BUDGET (a tree), "
                             "without the float32 check (a deep chain leaves τ room that a depth-5 tree caps at 6)")
    parser.add_argument("--max-len", type=int, default=2048, help="runtime cache slots")
    parser.add_argument("--device", default=None, help="default: cuda if there is one, else cpu")
    parser.add_argument("--dtype", default="auto", help="the bench's runtime dtype (the lossless check: float32)")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    args.shapes, args.overrides = split_overrides(args.shapes, args.overrides)  # and --shapes
    check_shapes(parser, args.shapes)
    args.prompt_dir = task_prompts(args.prompt_dir or args.vlm / "prompts", args.tasks)
    missing = [name for name in ("distill.jsonl", "test.jsonl") if not (args.prompt_dir / name).is_file()]
    if missing:
        parser.error(f"--tasks {args.tasks}: {args.prompt_dir} holds no {' or '.join(missing)} (a VLM that "
                     f"`specdraft build-small-vlm` builds writes both, its determined/ sets too)")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: Optional[List[str]] = None) -> dict:
    args = _args(argv)
    out = args.out
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = {"machine": machine(args.device), "settings": settings, "runs": {}}
    started = time.perf_counter()
    vispec = distill_stage(args, out, report)
    write_report(out, report, "vispec")
    train_stage({"vispec": vispec, "eagle3": eagle3_twin(vispec, out)}, out, report)
    write_report(out, report, "vispec")
    bench_stage(out, args, report)
    taus = {name: run["bench"]["tau"] for name, run in report["runs"].items()}
    report["tau_ratio"] = taus["vispec"] / taus["eagle3"] if taus.get("eagle3") else None
    report["by_shape"] = {shape: by_shape(report["runs"], shape) for shape in args.shapes}
    report["seconds"] = time.perf_counter() - started
    text = tables(report)
    print(text)
    print(f"-> {write_report(out, report, 'vispec')} ({report['seconds']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
