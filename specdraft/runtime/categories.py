"""`specdraft bench --categories`: Spec-Bench's six categories (MT-bench, translation, summarization, QA, math
reasoning, RAG; hemingkx/Spec-Bench's question.jsonl), each under several runtime variants (drafting policies and
their settings), against plain decoding on the same prompts in the same run. Writes bench_categories.json.

A variant is `POLICY[,FIELD=VALUE...]`: a runtime.policy and any runtime fields over the bench's own settings,
e.g. `sam,sam_merge=true` or `ddd,depth=7`. Each variant is its own runtime over the one loaded target. Per
category, every prompt is decoded plainly once (the first variant's engine), then by every variant, so each
speedup is over the plain rate of the same prompts measured beside it. At T=0 the first `lossless_prompts`
prompts of each category are decoded again in float32, plainly once and by every variant, token for token. A
variant that fails (in its warm-up, on a prompt, in the float32 check) is recorded in the report's `errors` and left
out of that category (of every category, from its warm-up); the others go on, and bench_categories.json is
rewritten after each category, so a run that stops keeps what it finished.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch
from tqdm import tqdm

from specdraft.config import RuntimeConfig
from specdraft.core.errors import SpecdraftError
from specdraft.core.io import write_json
from specdraft.runtime.bench import warm_prompt_lengths
from specdraft.runtime.flags import field_types, value_type
from specdraft.runtime.load import Runtime

SPEC_BENCH = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
"""Spec-Bench's categories, in its order."""
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
"""MT-bench's own categories, which Spec-Bench's file keeps: together they are its multi-turn category."""
VARIANTS = ("fixed", "sam", "svip", "ddd", "adaptive")


@dataclass
class CategorySettings:
    prompts: str  # a Spec-Bench question.jsonl
    per_category: Optional[int] = None  # the first N prompts of each category (None: all)
    variants: Sequence[str] = VARIANTS
    temperatures: Sequence[float] = (0.0,)
    max_new_tokens: int = 256
    seed: int = 0
    lossless_prompts: int = 10  # per category, checked in float32 at T=0 (0: not checked)
    categories: Optional[Sequence[str]] = None  # only these (None: every category of the file)


def category_of(record: dict) -> str:
    category = record.get("category", "")
    return "mt_bench" if category in MT_BENCH else category


def category_prompts(path: str, per_category: Optional[int]) -> Dict[str, List[str]]:
    """{category: first user turns}, Spec-Bench's categories first, at most `per_category` each."""
    grouped: Dict[str, List[str]] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SpecdraftError(f"--prompts {path}: {err.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            grouped.setdefault(category_of(record), []).append(record["turns"][0])
        except (ValueError, KeyError, IndexError, TypeError):
            raise SpecdraftError(f"{path}:{number}: not a Spec-Bench question (category, turns)") from None
    order = [c for c in SPEC_BENCH if c in grouped] + sorted(c for c in grouped if c not in SPEC_BENCH)
    if not order:
        raise SpecdraftError(f"no questions in {path}")
    return {category: grouped[category][:per_category] for category in order}


def parse_variant(text: str) -> Dict[str, object]:
    """`POLICY[,FIELD=VALUE...]` -> RuntimeConfig overrides, each value of its field's type."""
    policy, *assignments = text.split(",")
    overrides: Dict[str, object] = {"policy": policy}
    kinds = {name: value_type(annotation) for name, annotation in field_types().items()}
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        kind = kinds.get(name)
        if kind is None or not value:
            raise SpecdraftError(f"variant {text!r}: {assignment!r} is not FIELD=VALUE of a runtime field")
        try:
            overrides[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        except ValueError:
            raise SpecdraftError(f"variant {text!r}: {name} takes a {kind.__name__}, got {value!r}") from None
    return overrides


def variant_configs(base: RuntimeConfig, variants: Sequence[str]) -> Dict[str, RuntimeConfig]:
    """Each variant's settings (checked, so a bad one fails before any model loads)."""
    return {text: replace(base, **parse_variant(text)) for text in variants}


@dataclass
class _Tally:
    tokens: int = 0
    seconds: float = 0.0
    cycles: int = 0
    emitted: int = 0  # accepted + bonus over the cycles: τ's numerator
    drafted: int = 0
    same_as_plain: int = 0

    def add(self, result, plain_tokens: Optional[List[int]] = None) -> None:
        self.tokens += len(result.tokens)
        self.seconds += result.seconds
        self.cycles += len(result.accepted)
        self.emitted += sum(a + 1 for a in result.accepted)
        self.drafted += sum(result.drafted)
        self.same_as_plain += plain_tokens is not None and result.tokens == plain_tokens

    def rate(self) -> Optional[float]:
        return self.tokens / self.seconds if self.seconds else None


def _fitting(encoded: Dict[str, List[List[int]]], runtimes: Dict[str, Runtime], max_new_tokens: int):
    """The prompts every variant's cache holds with their answers -> ({category: prompts}, {category: skipped})."""
    def fits(prompt: List[int]) -> bool:
        return all(r.engine.room_needed(len(prompt), max_new_tokens) <= r.engine.max_len for r in runtimes.values())

    kept = {category: [p for p in prompts if fits(p)] for category, prompts in encoded.items()}
    skipped = {category: len(encoded[category]) - len(kept[category]) for category in encoded}
    return {category: prompts for category, prompts in kept.items() if prompts}, skipped


WARM_TOKENS = 48
"""Tokens each variant generates per category before the timed runs (at most the run's max_new_tokens), so that
its cycles' graphs are captured."""


def _error(variant: str, category: Optional[str], temperature: float, stage: str, err: BaseException) -> dict:
    """A failure recorded in the report, one line: where (variant, category, stage) and what."""
    message = (str(err).strip().splitlines() or [""])[0][:300]
    return {"variant": variant, "category": category, "temperature": temperature, "stage": stage,
            "error": f"{type(err).__name__}: {message}"}


def _warm(runtimes: Dict[str, Runtime], prompts: Dict[str, List[List[int]]], temperature: float,
          max_new_tokens: int, errors: List[dict]) -> Dict[str, Runtime]:
    """Every variant's graphs captured, and every prompt length's prefill met, before any timed run -> the variants
    that warmed (a failure is recorded in `errors` and leaves that variant out of this temperature's runs)."""
    warmed = {}
    for name, runtime in runtimes.items():
        engine = runtime.engine
        try:
            for encoded in prompts.values():
                engine.generate(encoded[0], min(WARM_TOKENS, max_new_tokens), runtime.eos_ids, temperature=temperature)
            engine.decode_plain(encoded[0], 8, runtime.eos_ids, temperature=temperature)
            warm_prompt_lengths(engine, _one_per_prefill(engine, [p for encoded in prompts.values() for p in encoded]))
        except Exception as err:  # noqa: BLE001 (recorded; the other variants go on)
            errors.append(_error(name, None, temperature, "warm", err))
            continue
        warmed[name] = runtime
    return warmed


def _one_per_prefill(engine, prompts: List[List[int]]) -> List[List[int]]:
    """The first prompt of each prefill length (the prompt's rows rounded up as the engine pads them): its graphs
    are captured once per length, so one prompt of each meets what a timed run would meet first."""
    by_rows: Dict[int, List[int]] = {}
    for prompt in prompts:
        by_rows.setdefault(-(-len(prompt) // engine.prefill_rows), prompt)
    return list(by_rows.values())


def _timed_category(runtimes: Dict[str, Runtime], encoded: List[List[int]], settings: CategorySettings,
                    temperature: float, category: str, errors: List[dict]):
    """Every prompt plainly (the first variant's engine), then by every variant -> (plain, {variant: tally},
    {variant: its policy's statistics over the category}); a variant that fails is recorded in `errors` and left
    out of the category (its tally dropped), the others go on."""
    first = next(iter(runtimes.values()))
    plain, tallies = _Tally(), {name: _Tally() for name in runtimes}
    generator = torch.Generator(device=first.engine.device).manual_seed(settings.seed)
    before = {name: runtime.engine.policy_stats() for name, runtime in runtimes.items()}
    for prompt in tqdm(encoded, desc=f"{category} T={temperature:g}", unit="prompt"):
        result = first.engine.decode_plain(prompt, settings.max_new_tokens, first.eos_ids, temperature=temperature,
                                           generator=generator)
        plain.add(result)
        for name in list(tallies):
            runtime = runtimes[name]
            try:
                spec = runtime.engine.generate(prompt, settings.max_new_tokens, runtime.eos_ids,
                                               temperature=temperature, generator=generator)
            except Exception as err:  # noqa: BLE001 (recorded; the other variants go on)
                errors.append(_error(name, category, temperature, "timed", err))
                del tallies[name]
                continue
            tallies[name].add(spec, result.tokens if temperature == 0 else None)
    after = {name: runtimes[name].engine.policy_stats() for name in tallies}
    stats = {name: {key: value - before[name].get(key, 0) for key, value in after[name].items()} for name in tallies}
    return plain, tallies, stats


def _float32_check(load: Callable[[str], Runtime], names: Sequence[str], encoded: List[List[int]],
                   settings: CategorySettings, category: str, errors: List[dict]) -> Dict[str, int]:
    """The first `lossless_prompts` prompts in float32: plainly once, by each variant -> {variant: identical} (a
    variant that fails is recorded in `errors` and left out)."""
    runtimes = {name: load(name) for name in names}
    first = runtimes[names[0]]
    identical = dict.fromkeys(names, 0)
    for prompt in encoded[:settings.lossless_prompts]:
        plain = first.engine.decode_plain(prompt, settings.max_new_tokens, first.eos_ids).tokens
        for name in list(identical):
            runtime = runtimes[name]
            try:
                identical[name] += runtime.engine.generate(prompt, settings.max_new_tokens, runtime.eos_ids).tokens \
                    == plain
            except Exception as err:  # noqa: BLE001 (recorded; the other variants go on)
                errors.append(_error(name, category, 0.0, "float32", err))
                del identical[name]
    return identical


def _rows(category: str, temperature: float, plain: _Tally, tallies: Dict[str, _Tally], stats: Dict[str, dict],
          checked: Optional[Dict[str, int]], prompts: int, checked_prompts: int) -> List[dict]:
    rows = []
    for name, tally in tallies.items():
        identical = checked.get(name) if checked is not None else None
        rows.append({
            "category": category, "variant": name, "temperature": temperature, "prompts": prompts,
            "tau": tally.emitted / max(1, tally.cycles), "drafted_per_cycle": tally.drafted / max(1, tally.cycles),
            "tokens_per_s": tally.rate(), "tokens_per_s_plain": plain.rate(),
            "speedup_vs_plain": tally.rate() / plain.rate() if tally.rate() and plain.rate() else None,
            "same_as_plain": tally.same_as_plain if temperature == 0 else None,
            "float32_identical": identical, "float32_prompts": checked_prompts if identical is not None else None,
            "policy_stats": stats[name]})
    return rows


def _category_rows(runtimes: Dict[str, Runtime], prompts: List[List[int]], settings: CategorySettings,
                   temperature: float, category: str, load: Optional[Callable[[str], Runtime]],
                   errors: List[dict]) -> List[dict]:
    """One category's rows at `temperature`: timed, then (T=0) float32-checked; its failures in `errors`."""
    try:
        plain, tallies, stats = _timed_category(runtimes, prompts, settings, temperature, category, errors)
    except Exception as err:  # noqa: BLE001 (plain decoding failed: the category has no baseline)
        errors.append(_error("plain", category, temperature, "timed", err))
        return []
    checked = None
    if temperature == 0 and settings.lossless_prompts > 0 and load is not None and tallies:
        try:
            checked = _float32_check(load, list(tallies), prompts, settings, category, errors)
        except Exception as err:  # noqa: BLE001 (loading float32, or its plain decoding, failed)
            errors.append(_error("plain", category, temperature, "float32", err))
    return _rows(category, temperature, plain, tallies, stats, checked, len(prompts),
                 min(settings.lossless_prompts, len(prompts)))


def run_categories(runtimes: Dict[str, Runtime], settings: CategorySettings, out_dir: str | Path,
                   load_float32: Optional[Callable[[str], Runtime]] = None) -> dict:
    """runtimes: {variant: Runtime} over one target; load_float32(variant) -> that variant in float32 (None:
    no float32 check unless the runtimes run float32 already). Writes OUT/bench_categories.json after each
    category (`complete` false until the last); a variant that fails is recorded in its `errors` (variant,
    category, stage, error) and the others go on."""
    first = next(iter(runtimes.values()))
    texts = category_prompts(settings.prompts, settings.per_category)
    if settings.categories is not None:
        texts = {category: texts[category] for category in settings.categories if category in texts}
    encoded, skipped = _fitting({category: [first.encode_chat(text) for text in items]
                                 for category, items in texts.items()}, runtimes, settings.max_new_tokens)
    exact = first.engine.dtype == torch.float32
    load = (lambda name: runtimes[name]) if exact else load_float32
    rows: List[dict] = []
    errors: List[dict] = []
    report = {"prompts": settings.prompts, "per_category": settings.per_category, "skipped_prompts": skipped,
              "max_new_tokens": settings.max_new_tokens, "variants": list(runtimes), "rows": rows, "errors": errors,
              "complete": False, "device": torch.cuda.get_device_name(first.engine.device)
              if first.engine.device.type == "cuda" else "cpu", "dtype": str(first.engine.dtype).replace("torch.", "")}
    for temperature in settings.temperatures:
        warmed = _warm(runtimes, encoded, temperature, settings.max_new_tokens, errors)
        for category, prompts in (encoded.items() if warmed else ()):
            rows += _category_rows(warmed, prompts, settings, temperature, category, load, errors)
            write_json(Path(out_dir) / "bench_categories.json", report)
    report["complete"] = True
    write_json(Path(out_dir) / "bench_categories.json", report)
    return report


def categories_table(report: dict) -> str:
    """A markdown table: per category and variant, τ, tokens/s, speedup over plain, float32 lossless; then each
    variant's mean speedup over the categories; then the failures, if any."""
    fmt = lambda x, p=2: "n/a" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = ["| T | category | variant | τ | drafted/cycle | tok/s | plain tok/s | × plain | float32 lossless |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        check = "n/a" if row["float32_identical"] is None else f"{row['float32_identical']}/{row['float32_prompts']}"
        lines.append(f"| {row['temperature']:g} | {row['category']} | {row['variant']} | {row['tau']:.2f} | "
                     f"{row['drafted_per_cycle']:.1f} | {fmt(row['tokens_per_s'], 1)} | "
                     f"{fmt(row['tokens_per_s_plain'], 1)} | {fmt(row['speedup_vs_plain'])} | {check} |")
    lines += ["", "| T | variant | mean × plain over the categories |", "|---|---|---|"]
    for temperature in sorted({row["temperature"] for row in report["rows"]}):
        for variant in report["variants"]:
            speedups = [r["speedup_vs_plain"] for r in report["rows"]
                        if r["variant"] == variant and r["temperature"] == temperature and r["speedup_vs_plain"]]
            mean = sum(speedups) / len(speedups) if speedups else None
            lines.append(f"| {temperature:g} | {variant} | {fmt(mean)} |")
    if report.get("errors"):
        lines += ["", "| T | variant | category | stage | error (left out of the rows above) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {e['temperature']:g} | {e['variant']} | {e['category'] or 'every'} | {e['stage']} | "
                  f"{e['error'].replace('|', '/')} |" for e in report["errors"]]
    return "\n".join(lines)
