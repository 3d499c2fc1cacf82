"""Drafting-policy suite: every runtime policy on Spec-Bench's six categories against plain decoding in the same run
(`categories`, the default: T=0, float32 lossless on each category's first prompts), and sampling at T=1 on the
default shapes with sampled and with point-mass drafts (`sampling`); `tiny-sampling` measures, on the CPU, τ at
T=1 of both draft kinds with a tiny target and a tiny draft trained on its sampled text.

    python -m tools.bench.policies EXPORT --target SmolLM2-135M-Instruct.Q4_1.gguf \\
        --prompts spec_bench/question.jsonl --out runs/bench          # both GPU parts (a few minutes on an H100)
    python -m tools.bench.policies categories EXPORT --target ... --prompts ... --variants fixed sam 'ddd,depth=7'
    python -m tools.bench.policies tiny-sampling --steps 300 --out runs/bench

`categories`: each variant (`POLICY[,FIELD=VALUE...]`, `specdraft bench --categories`' syntax) is a runtime over
the one loaded target; per category every prompt is decoded plainly once, then by every variant
(`specdraft.runtime.categories`); the table has τ, tokens/s, the speedup over plain and the float32 check per
category and variant, then each variant's mean speedup, then each variant against the first (the fixed tree) per
category, then the issue's goals with a verdict each (SAM ≥ 1.15× EAGLE-3 alone on summarization and RAG, ≥ 0.98×
on every other category; SVIP, DDD or the adaptive depth ≥ 1.05× the fixed shape on average; every row
float32-identical).
`sampling`: the same at T=1 on the MT-bench category (`--sampling-categories`: others, or all) for the default
tree ((3, 6, 16) at T > 0), the T=0 default tree and a chain, each with sampled drafts (the runtime's default) and
with point-mass drafts (`sample_drafts=false`), and its goals on MT-bench (the default tree ≥ 1.5× plain, every
default shape ≥ 1.0×). A variant that fails (to build, to warm up, on a prompt) is recorded in its
part's `errors` and left out; the others go on. OUT/policies.json, rewritten after each part, and each part's
OUT/policies-T{0,1}/bench_categories.json, rewritten after each category.

Cost on one H200 (SmolLM2, 60 prompts, 128 tokens, six variants; estimated): loading ~30 s, the categories' warm-up
~30 s, their timed runs ~45 s, the float32 check (10 prompts a category: plain and every variant again, and the
float32 runtimes' graph captures) ~80 s, the sampling part ~20 s: about 3.5 minutes in all.
"""
from __future__ import annotations

import argparse
import functools
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

from tools.bench.suite import finish, fmt, machine, markdown_table, run_parts, write_report

import torch

from specdraft.config import RuntimeConfig
from specdraft.runtime.categories import parse_variant

CATEGORY_VARIANTS = ["fixed", "sam", "sam,sam_merge=true", "svip", "ddd", "ddd,depth=7", "adaptive"]
SAMPLING_VARIANTS = ["fixed", "fixed,depth=5,topk=8,budget=40", "fixed,sample_drafts=false",
                     "fixed,chain=true,depth=6",
                     "fixed,chain=true,depth=6,sample_drafts=false"]  # fixed: at T > 0 the runtime's (3, 6, 16)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export", help="an EAGLE-3 export directory (or a training run directory)")
    parser.add_argument("--prompts", required=True, help="Spec-Bench's question.jsonl")
    parser.add_argument("--per-category", type=int, default=10, help="prompts per category (default 10)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    parser.add_argument("--lossless-prompts", type=int, default=10, help="per category, checked in float32")
    parser.add_argument("--target", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-len", type=int, default=3072, help="cache slots (Spec-Bench's longest prompts)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))


class Parts:
    """The target and draft loaded once (and in float32 once, when first asked), runtimes built over them."""

    def __init__(self, args: argparse.Namespace):
        from specdraft.runtime.load import load_parts

        self.args, self.base = args, RuntimeConfig(device=args.device, dtype=args.dtype, max_len=args.max_len)
        self.loaded = load_parts(args.export, self.base, args.target)
        self.float32_loaded = functools.lru_cache(maxsize=1)(
            lambda: load_parts(args.export, replace(self.base, dtype="float32"), args.target))

    def runtimes(self, variants: List[str]):
        """-> ({variant: runtime}, variant -> its float32 runtime, built once, [a variant that could not be built:
        its error, recorded as run_categories records one])."""
        from specdraft.runtime.categories import variant_configs
        from specdraft.runtime.load import build_runtime

        configs = variant_configs(self.base, variants)
        float32 = functools.lru_cache(maxsize=None)(
            lambda name: build_runtime(*self.float32_loaded(), replace(configs[name], dtype="float32")))
        runtimes, errors = {}, []
        for name, cfg in configs.items():
            try:
                runtimes[name] = build_runtime(*self.loaded, cfg)
            except Exception as err:  # noqa: BLE001 (recorded; the other variants go on)
                errors.append({"variant": name, "category": None, "temperature": None, "stage": "build",
                               "error": f"{type(err).__name__}: {err}"})
        return runtimes, float32, errors


def run_part(parts: Parts, variants: List[str], temperature: float, categories=None) -> dict:
    from specdraft.runtime.categories import CategorySettings, run_categories

    args = parts.args
    runtimes, float32, errors = parts.runtimes(variants)
    if not runtimes:
        return {"variants": [], "rows": [], "errors": errors, "complete": False, "seconds": 0.0}
    settings = CategorySettings(prompts=args.prompts, per_category=args.per_category, variants=list(runtimes),
                                temperatures=(temperature,), max_new_tokens=args.max_new_tokens,
                                lossless_prompts=args.lossless_prompts, categories=categories)
    started = time.perf_counter()
    report = run_categories(runtimes, settings, args.out / f"policies-T{temperature:g}", load_float32=float32)
    return {**report, "errors": errors + report["errors"], "seconds": time.perf_counter() - started}


def ratios_to_first(report: dict) -> Dict[str, Dict[str, Optional[float]]]:
    """{variant: {category: its tokens/s over the first variant's (the fixed tree)}} for every later variant."""
    variants, rows = report["variants"], report["rows"]
    categories = list(dict.fromkeys(row["category"] for row in rows))
    rate = {(row["category"], row["variant"]): row["tokens_per_s"] for row in rows}
    def ratio(category: str, variant: str) -> Optional[float]:
        base, own = rate.get((category, variants[0])), rate.get((category, variant))
        return own / base if base and own else None

    return {variant: {category: ratio(category, variant) for category in categories} for variant in variants[1:]}


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def against_first(report: dict) -> str:
    """Each variant's tokens/s over the first variant's (the fixed tree), per category, and their mean."""
    ratios, first = ratios_to_first(report), report["variants"][0]
    categories = list(next(iter(ratios.values()), {}))
    lines = [[category, *(fmt(by[category], ".3f") for by in ratios.values())] for category in categories]
    lines.append(["mean", *(fmt(_mean(by.values()), ".3f") for by in ratios.values())])
    return markdown_table(["category", *(f"{v} / {first}" for v in ratios)], lines)


def _verdict(value: Optional[float], goal: float) -> str:
    return "n/a" if value is None else ("met" if value >= goal else "missed")


def category_goals(report: dict) -> str:
    """The issue's T=0 goals against the first variant (the fixed tree): each SAM variant ≥ 1.15× on summarization
    and RAG and ≥ 0.98× on every other category; SVIP, DDD or the adaptive depth ≥ 1.05× on average; every row
    float32-identical on all its checked prompts."""
    lines = []
    for variant, by in ratios_to_first(report).items():
        policy = parse_variant(variant)["policy"]
        if policy == "sam":
            for category in ("summarization", "rag"):
                lines.append([variant, f"× fixed on {category}", fmt(by.get(category), ".3f"), "≥ 1.15",
                              _verdict(by.get(category), 1.15)])
            others = [r for c, r in by.items() if c not in ("summarization", "rag")]
            low = min(others) if others and None not in others else None
            lines.append([variant, "× fixed, lowest other category", fmt(low, ".3f"), "≥ 0.98", _verdict(low, 0.98)])
        elif policy in ("svip", "ddd", "adaptive"):
            mean = _mean(by.values()) if None not in by.values() else None
            lines.append([variant, "× fixed, mean of the categories", fmt(mean, ".3f"), "≥ 1.05",
                          _verdict(mean, 1.05)])
    checked = [(r["float32_identical"], r["float32_prompts"]) for r in report["rows"]]
    exact = bool(checked) and all(i is not None and i == n for i, n in checked) and not report.get("errors")
    lines.append(["every variant", "float32 identical to plain", f"{sum(i or 0 for i, _ in checked)}/"
                  f"{sum(n or 0 for _, n in checked)}", "all", "met" if exact else "missed"])
    return markdown_table(["variant", "goal", "measured", "target", "verdict"], lines)


def sampling_goals(report: dict) -> str:
    """The issue's T=1 goals on MT-bench: the default tree with its default (sampled) drafts ≥ 1.5× plain, and every
    default shape (each variant whose drafts are the default) ≥ 1.0×; point-mass rows are comparisons, not goals."""
    speedup = {row["variant"]: row["speedup_vs_plain"] for row in report["rows"]
               if row.get("category", "mt_bench") == "mt_bench"}
    lines = []
    for variant in report["variants"]:
        overrides = parse_variant(variant)
        if overrides["policy"] != "fixed" or overrides.get("sample_drafts", True) is False:
            continue
        goal = 1.5 if set(overrides) == {"policy"} else 1.0  # the default tree; any other shape
        lines.append([variant, "× plain at T=1", fmt(speedup.get(variant), ".3f"), f"≥ {goal:g}",
                      _verdict(speedup.get(variant), goal)])
    return markdown_table(["variant", "goal", "measured", "target", "verdict"], lines)


def gpu_main(argv: List[str], parts_run=("categories", "sampling")) -> dict:
    from specdraft.runtime.categories import categories_table

    parser = argparse.ArgumentParser(description="drafting policies per Spec-Bench category")
    _common(parser)
    parser.add_argument("--variants", nargs="+", default=CATEGORY_VARIANTS)
    parser.add_argument("--sampling-variants", nargs="+", default=SAMPLING_VARIANTS)
    parser.add_argument("--sampling-categories", nargs="+", default=["mt_bench"],
                        help="the categories sampled at T=1 (default mt_bench, the goals' one; all: every one)")
    args = parser.parse_args(argv)
    parts = Parts(args)
    report = {"export": str(args.export), "machine": machine(str(parts.loaded[1].model.device)),
              "prompts": args.prompts, "per_category": args.per_category}
    tables = []
    if "categories" in parts_run:
        report["categories"] = run_part(parts, args.variants, 0.0)
        write_report(args.out, report, "policies")
        tables += [categories_table(report["categories"]), against_first(report["categories"]),
                   category_goals(report["categories"])]
    if "sampling" in parts_run:
        categories = None if args.sampling_categories == ["all"] else tuple(args.sampling_categories)
        report["sampling"] = run_part(parts, args.sampling_variants, 1.0, categories=categories)
        write_report(args.out, report, "policies")
        tables += [categories_table(report["sampling"]), sampling_goals(report["sampling"])]
    return finish("\n\n".join(tables), args.out, report, "policies")


def _tiny_pair(steps: int, scale: float, sequences: int = 24, held_out: int = 4):
    """A tiny random target (its LM head scaled by `scale`) and an EAGLE-3 draft trained `steps` steps on the
    target's own sampled (T=1) continuations of random prompts -> (model, info, spec, cfg, draft, held-out
    prompts)."""
    from transformers import LlamaForCausalLM

    from specdraft.core.types import DraftBatch, DraftContext, TargetInfo
    from specdraft.methods import METHODS
    from specdraft.targets import capture_features
    from specdraft.testing.tiny import tiny_llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(layers=4)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
        generator = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, 300, (1, 12), generator=generator) for _ in range(sequences)]
        texts = torch.cat([model.generate(p, do_sample=True, top_k=0, max_new_tokens=48, min_new_tokens=48,
                                          eos_token_id=None, pad_token_id=0) for p in prompts])  # [S, 60]
    info, spec = TargetInfo.from_hf_config(model.config, "tiny"), METHODS["eagle3"]
    cfg = spec.config(draft_vocab_size=320, init_std=0.3, ttt_steps=3)
    draft = spec.build(cfg, DraftContext(info))
    train = texts[:-held_out]
    ones = torch.ones_like(train)
    batch = DraftBatch(train, ones, ones, capture_features(model, train, ones, spec.feature_layers(cfg, info)))
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    with torch.enable_grad():
        for _ in range(steps):
            loss = spec.loss(draft, batch, cfg).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model, info, spec, cfg, draft.eval(), [row[:12].tolist() for row in texts[-held_out:]]


@torch.no_grad()
def measure(steps: int, scale: float, repeats: int = 3) -> List[dict]:
    """τ at T=1 of the tiny pair, tree (4, 4, 16) and chain of 4, sampled and point-mass drafts."""
    from specdraft.decoding.engine import SpecEngine
    from specdraft.decoding.verifier import from_hf, hf_rope_tables
    from specdraft.decoding.tree import TreeShape

    model, info, spec, cfg, draft, prompts = _tiny_pair(steps, scale)
    rows = []
    for shape in (TreeShape(depth=4, topk=4, budget=16), TreeShape.chain(4)):
        for sampled in (True, False):
            target = from_hf(model, info)
            engine = SpecEngine(target, spec.runtime(draft, cfg, target), shape, 256, hf_rope_tables(model, 256),
                                sample_drafts=sampled)
            generator, accepted = torch.Generator().manual_seed(0), []
            for _ in range(repeats):
                for prompt in prompts:
                    accepted += engine.generate(prompt, 48, temperature=1.0, generator=generator).accepted
            rows.append({"shape": f"{shape.depth},{shape.topk},{shape.budget}" if shape.topk > 1 else
                         f"chain {shape.depth}", "drafts": "sampled" if sampled else "point-mass",
                         "tau": sum(a + 1 for a in accepted) / len(accepted), "cycles": len(accepted)})
    return rows


def tiny_sampling_main(argv: List[str]) -> dict:
    """τ at T=1, sampled against point-mass drafts, on a tiny target whose T=1 distribution is spread and a tiny
    EAGLE-3 draft trained on its sampled text (CPU, a few minutes)."""
    parser = argparse.ArgumentParser(description=tiny_sampling_main.__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="draft training steps")
    parser.add_argument("--scale", type=float, default=4.0, help="the target's LM head scaled by it (peakedness)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = parser.parse_args(argv)
    os.environ.setdefault("SPECDRAFT_KERNELS", "reference")
    rows = measure(args.steps, args.scale)
    table = markdown_table(["shape", "drafts", "τ at T=1", "cycles"],
                           [[r["shape"], r["drafts"], f"{r['tau']:.3f}", r["cycles"]] for r in rows])
    return finish(table, args.out, {"machine": machine("cpu"), "steps": args.steps, "scale": args.scale,
                                    "rows": rows}, "policies_tiny_sampling")


PARTS = {"all": gpu_main, "categories": functools.partial(gpu_main, parts_run=("categories",)),
         "sampling": functools.partial(gpu_main, parts_run=("sampling",)), "tiny-sampling": tiny_sampling_main}


def main(argv=None):
    return run_parts(PARTS, argv)


if __name__ == "__main__":
    main()
