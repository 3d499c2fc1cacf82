"""specdraft command line: distill-data | train | export | eval. New knobs go into recipe dataclasses, not flags.

    specdraft distill-data RECIPE [--merge] [key=value ...]
    specdraft train RECIPE [key=value ...]
    specdraft export RUN_DIR --format hf|speculators --out DIR
    specdraft eval RUN_OR_EXPORT_DIR [--out DIR] [key=value ...]
    specdraft generate EXPORT_DIR --prompt TEXT [--max-new-tokens N] [--temperature T]
    specdraft bench EXPORT_DIR [--prompts FILE] [--max-prompts N] [--max-new-tokens N] [--temperature T ...]
        (generate and bench, chains: [--chain --depth K] [--exit-threshold ETA] [--dynamic-exit [--more-exits DIR ...]])
    specdraft slurm train|distill-data RECIPE --nodes N --gpus-per-node G [--partition P --time T ...]
                    [--dry-run] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from typing import List, Optional

from specdraft.core.errors import SpecdraftError


def _distill(args) -> dict:
    from data_gen.distill import merge_only, run_distill
    from specdraft.recipes import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    return merge_only(recipe) if args.merge else run_distill(recipe)


def _train(args) -> dict:
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    return run_train(load_recipe(args.recipe, args.overrides))


def _export(args) -> dict:
    from specdraft.export import export_draft

    return {"export": str(export_draft(args.run_dir, args.format, args.out, args.dtype)), "format": args.format}


def _eval(args) -> dict:
    from specdraft.eval.run import run_eval

    report = run_eval(args.path, args.out, args.overrides)
    rates = " ".join(f"{r:.2f}" for r in report["acceptance_by_position"])
    print(f"tau={report['tau']:.3f} lossless={report['lossless']} acceptance_by_position=[{rates}]")
    return report


def _runtime_args(cmd) -> None:
    """The runtime's flags, each mapped onto the `runtime:` recipe field of the same name (specdraft.config.
    RuntimeConfig). A flag left out keeps the draft's own setting (its export's or its recipe's)."""
    from specdraft.config import POLICIES

    cmd.add_argument("path", help="an export directory (or a training run directory)")
    cmd.add_argument("--target", default=None, help="the target to run (default: the one the draft was trained for)")
    cmd.add_argument("--trust-remote-code", action="store_true",
                     help="let the target's own modeling code run (a hub model that ships Python); never set by a "
                          "file: only this flag turns it on, for this command")
    cmd.add_argument("--device", default=None, help="auto (default: the first GPU, else cpu), cpu, cuda, cuda:N")
    cmd.add_argument("--dtype", default=None, choices=("auto", "float32", "bfloat16", "float16"),
                     help="target and draft dtype (default auto: bf16 on GPUs that have it, else float32)")
    cmd.add_argument("--depth", type=int, default=None,
                     help="drafted tokens on the longest path (default: 5 for a tree, 6 for a chain)")
    cmd.add_argument("--topk", type=int, default=None, help="children per expanded node (1: a chain; default 8)")
    cmd.add_argument("--budget", type=int, default=None, help="tree nodes verified, the root included (default 40)")
    cmd.add_argument("--chain", action="store_true", default=None, help="a chain of --depth drafts (same as --topk 1)")
    cmd.add_argument("--exit-threshold", type=float, default=None, metavar="ETA",
                     help="chains: stop drafting once the draft's top-1 probability falls below ETA (0: off; "
                          "default: the draft's own, e.g. Kangaroo's method.exit_threshold, else off)")
    cmd.add_argument("--dynamic-exit", action="store_true", default=None,
                     help="chains: choose the draft length per context from acceptance statistics (DEL)")
    cmd.add_argument("--more-exits", nargs="+", default=None, metavar="EXPORT_DIR",
                     help="chains, with --dynamic-exit: drafts of the same target at other exit layers; each cycle "
                          "drafts with the one DEL's statistics favour")
    cmd.add_argument("--no-shallow-reuse", dest="shallow_reuse", action="store_false", default=None,
                     help="chains: verify through every target layer even if the draft ran the shallow ones")
    cmd.add_argument("--shallow-reuse-tree", action="store_true", default=None,
                     help="trees, for drafts that run the target's shallow layers (Kangaroo): run every candidate "
                          "through them while drafting and verify from above them")
    cmd.add_argument("--prune-threshold", type=float, default=None, metavar="BETA",
                     help="drafts that score their tree (C2T): drop candidates scored below BETA (default: the "
                          "draft's own)")
    cmd.add_argument("--judge-threshold", type=float, default=None, metavar="DELTA",
                     help="drafts that ship a judge: also accept drafted tokens the judge scores above DELTA "
                          "(lossy, T=0 only; default: exact acceptance)")
    cmd.add_argument("--policy", default=None, choices=POLICIES,
                     help="what each cycle drafts: fixed (default), sam (retrieval drafts from a suffix automaton of "
                          "the prompt and answer), svip (stop at the draft entropy's acceptance bound), ddd (stop "
                          "growing the tree at the frontier's summed probability)")
    cmd.add_argument("--sam-min-match", type=int, default=None, metavar="N",
                     help="sam: the suffix match (tokens) from which the retrieval draft is used (default 4)")
    cmd.add_argument("--sam-draft", type=int, default=None, metavar="K",
                     help="sam: retrieved tokens verified per retrieval cycle (default 10, at most 32)")
    cmd.add_argument("--sam-merge", action="store_true", default=None,
                     help="sam, trees: verify the retrieval draft grafted onto the model's tree in one pass")
    cmd.add_argument("--sam-corpus", default=None, metavar="FILE",
                     help="sam: a text file (documents apart by blank lines) to retrieve from as well")
    cmd.add_argument("--svip-threshold", type=float, default=None, metavar="A",
                     help="svip: stop below this estimated acceptance (default 0.4)")
    cmd.add_argument("--ddd-threshold", type=float, default=None, metavar="P",
                     help="ddd: stop below this frontier probability mass (default 0.25)")
    cmd.add_argument("--no-sample-drafts", dest="sample_drafts", action="store_false", default=None,
                     help="at T > 0, draft every child as a point mass of the draft's top-k (default: each "
                          "node's first child sampled from the draft)")
    cmd.add_argument("--no-overlap", dest="overlap", action="store_false", default=None,
                     help="read every step's tokens before queuing the next (default: one step in flight)")
    cmd.add_argument("--max-len", type=int, default=None, help="KV-cache slots: prompt + answer + tree (default 2048)")
    cmd.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false", default=None,
                     help="run every step eagerly on a GPU (default: CUDA graphs)")
    cmd.add_argument("--max-new-tokens", type=int, default=256, help="tokens generated per prompt (default 256)")
    cmd.add_argument("--seed", type=int, default=0, help="sampling seed at T > 0 (default 0)")


RUNTIME_FLAGS = ("device", "dtype", "depth", "topk", "budget", "chain", "exit_threshold", "dynamic_exit",
                 "more_exits", "shallow_reuse", "shallow_reuse_tree", "prune_threshold", "judge_threshold", "policy",
                 "sam_min_match", "sam_draft", "sam_merge", "sam_corpus", "svip_threshold", "ddd_threshold",
                 "sample_drafts", "overlap", "max_len", "cuda_graphs")
"""The runtime flags, by their RuntimeConfig field names."""


def runtime_config(args, dtype: Optional[str] = None):
    """The draft's own runtime settings with every flag given on the command line over them (`dtype` over all)."""
    from specdraft.drafts import runtime_settings

    given = {name: getattr(args, name) for name in RUNTIME_FLAGS if getattr(args, name) is not None}
    if dtype is not None:
        given["dtype"] = dtype
    try:
        return replace(runtime_settings(args.path), **given)
    except TypeError as err:
        raise SpecdraftError(f"bad runtime setting: {err}") from None


def _load_runtime(args, dtype: Optional[str] = None):
    """The runtime the arguments describe, in `dtype` when given (else the settings')."""
    from specdraft.runtime.load import load_runtime

    return load_runtime(args.path, runtime_config(args, dtype), args.target, args.trust_remote_code)


def _generate(args) -> None:
    import torch

    runtime = _load_runtime(args)
    generator = torch.Generator(device=runtime.engine.device).manual_seed(args.seed)
    result = runtime.engine.generate(runtime.encode_chat(args.prompt), args.max_new_tokens, runtime.eos_ids,
                                     temperature=args.temperature, generator=generator)
    text = runtime.target.tokenizer.decode(result.tokens, skip_special_tokens=True)
    print(text)
    tau = sum(a + 1 for a in result.accepted) / max(1, len(result.accepted))
    print(f"specdraft: {len(result.tokens)} tokens in {result.seconds:.2f} s "
          f"({len(result.tokens) / max(result.seconds, 1e-9):.1f} tokens/s), tau={tau:.2f}", file=sys.stderr)
    return None


def _bench_categories(args) -> dict:
    """`bench --categories`: each --policies variant on each Spec-Bench category (specdraft.runtime.categories)."""
    import functools

    from specdraft.runtime.categories import CategorySettings, categories_table, run_categories, variant_configs
    from specdraft.runtime.load import build_runtime, load_parts

    if not args.prompts:
        raise SpecdraftError("--categories needs --prompts: a Spec-Bench question.jsonl")
    configs = variant_configs(runtime_config(args), args.policies)
    parts = load_parts(args.path, next(iter(configs.values())), args.target, args.trust_remote_code)
    runtimes = {name: build_runtime(*parts, cfg) for name, cfg in configs.items()}
    float32_parts = functools.lru_cache(maxsize=1)(
        lambda: load_parts(args.path, runtime_config(args, "float32"), args.target, args.trust_remote_code))
    float32 = functools.lru_cache(maxsize=None)(
        lambda name: build_runtime(*float32_parts(), replace(configs[name], dtype="float32")))
    settings = CategorySettings(prompts=args.prompts, per_category=args.max_prompts, variants=args.policies,
                                temperatures=tuple(args.temperature or (0.0,)), max_new_tokens=args.max_new_tokens,
                                seed=args.seed, lossless_prompts=args.lossless_prompts)
    report = run_categories(runtimes, settings, args.out, load_float32=float32)
    print(categories_table(report), file=sys.stderr)
    return {"rows": len(report["rows"]), "out": str(args.out)}


def _bench(args) -> dict:
    from specdraft.runtime.bench import BenchSettings, format_table, run_bench

    if args.categories:
        return _bench_categories(args)
    runtime = _load_runtime(args)
    settings = BenchSettings(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens,
                             temperatures=tuple(args.temperature or (0.0, 1.0)), seed=args.seed,
                             hf_baseline=not args.no_hf,
                             hf_prompts=args.hf_prompts,
                             trace=args.trace, lossless_prompts=args.lossless_prompts,
                             **({"prompts": args.prompts} if args.prompts else {}))
    report = run_bench(runtime, settings, args.out, load_float32=lambda: _load_runtime(args, "float32"))
    print(format_table(report), file=sys.stderr)
    return {k: report[k] for k in ("tau", "tokens_per_s", "speedup_vs_plain", "speedup_vs_hf", "lossless")}
def _slurm(args) -> dict:
    from specdraft.launch.slurm import SlurmJob, run_slurm

    options = {name: getattr(args, name) for name in ("nodes", "gpus_per_node", "workers", "partition", "time",
                                                      "account", "cpus_per_task", "mem", "signal_seconds",
                                                      "template")}
    return run_slurm(SlurmJob(kind=args.kind, recipe=args.recipe, overrides=args.overrides, **options),
                     dry_run=args.dry_run)


def _add_slurm(sub) -> None:
    slurm = sub.add_parser("slurm", help="write an sbatch script for train or distill-data and submit it")
    slurm.add_argument("kind", choices=("train", "distill-data"))
    slurm.add_argument("recipe")
    slurm.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    slurm.add_argument("--nodes", type=int, default=1)
    slurm.add_argument("--gpus-per-node", type=int, default=0, help="0 runs on CPUs (one task per node)")
    slurm.add_argument("--workers", type=int, default=None,
                       help="distill-data array tasks (default: nodes x gpus-per-node, one GPU each)")
    slurm.add_argument("--partition")
    slurm.add_argument("--time", help="time limit, e.g. 24:00:00")
    slurm.add_argument("--account")
    slurm.add_argument("--cpus-per-task", type=int)
    slurm.add_argument("--mem", help="memory per node, e.g. 200G")
    slurm.add_argument("--signal-seconds", type=int, default=120,
                       help="train: SIGUSR1 this many seconds before the time limit (save and requeue)")
    slurm.add_argument("--template", help="an sbatch template of your own (default: the packaged specdraft/launch/templates/KIND.sbatch)")
    slurm.add_argument("--dry-run", action="store_true", help="print the script instead of submitting it")
    slurm.set_defaults(func=_slurm)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdraft", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, helptext in (("distill-data", _distill, "regenerate answers with the target"),
                                 ("train", _train, "train a draft on distilled data")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("recipe")
        cmd.add_argument("overrides", nargs="*", help="recipe overrides, key=value (e.g. train.max_steps=10)")
        cmd.set_defaults(func=func)
        if name == "distill-data":
            cmd.add_argument("--merge", action="store_true",
                             help="only merge the shards that distill-data workers wrote (all must exist)")
    export = sub.add_parser("export", help="write a checkpoint a serving engine loads")
    export.add_argument("run_dir")
    export.add_argument("--format", default="hf", help="hf (SGLang), speculators (vLLM)")
    export.add_argument("--out", required=True)
    export.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    export.set_defaults(func=_export)
    evaluate = sub.add_parser("eval", help="acceptance length against the real target, checked lossless")
    evaluate.add_argument("path", help="a training run directory or an export directory")
    evaluate.add_argument("--out", default=None, help="where eval.json and eval.png go (default: PATH)")
    evaluate.add_argument("overrides", nargs="*", help="recipe overrides, e.g. eval.max_prompts=10")
    evaluate.set_defaults(func=_eval)
    generate = sub.add_parser("generate", help="one completion with speculative decoding (text on stdout)")
    _runtime_args(generate)
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.set_defaults(func=_generate)
    bench = sub.add_parser("bench", help="tau, tokens/s and speedups against plain decoding and HF generate")
    _runtime_args(bench)
    bench.add_argument("--prompts", default=None, help="prompt file (default: MT-bench's questions)")
    bench.add_argument("--max-prompts", type=int, default=None)
    bench.add_argument("--temperature", type=float, nargs="+", default=None,
                       help="temperatures to bench (default: 0 and 1; with --categories, 0)")
    bench.add_argument("--categories", action="store_true",
                       help="Spec-Bench's six categories of --prompts (its question.jsonl), each --policies variant "
                            "against plain decoding: bench_categories.json and a table (--max-prompts: per category)")
    bench.add_argument("--policies", nargs="+", default=["fixed", "sam", "svip", "ddd"], metavar="VARIANT",
                       help="with --categories: POLICY[,FIELD=VALUE...] each, e.g. sam,sam_merge=true ddd,depth=7 "
                            "(default: fixed sam svip ddd)")
    bench.add_argument("--out", default="bench")
    bench.add_argument("--trace", action="store_true", help="write trace.jsonl: per cycle tree, probs, path")
    bench.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate baseline")
    bench.add_argument("--hf-prompts", type=int, default=None, metavar="N",
                       help="the Hugging Face baseline on the first N prompts alone (it decodes 20-50x slower); "
                            "its speedups compare all three on those prompts (default: every prompt)")
    bench.add_argument("--lossless-prompts", type=int, default=10, metavar="N",
                       help="also check the first N prompts in float32, speculative against plain decoding token "
                            "for token (in bf16 near-tied argmaxes can round apart; 0: off)")
    bench.set_defaults(func=_bench)
    _add_slurm(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)  # overrides may follow options: eval DIR --out X k=v
    if extra and (not hasattr(args, "overrides") or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        result = args.func(args)
    except SpecdraftError as err:
        print(f"specdraft: error: {err}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
