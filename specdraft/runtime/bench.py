"""`specdraft bench`: speculative decoding against plain decoding in this runtime and against Hugging Face
`generate`, on the same prompts, in one run. Writes bench.json, bench.png and (asked) trace.jsonl. Prompts are
token ids or PromptInputs (an image prompt set's, for a vision-language target: `encode_prompts`).

Every run reports the tokens the target verified per cycle (`verified_per_cycle`: the tree's valid nodes, root
included) and the rows its verify ran (`verify_rows_per_cycle`: padding included, the budget's for a fixed tree,
the kept nodes' size for a pruned one, engine.py; None for chains and drafting policies). For a draft that scores
its tree (DrafterCaps.scores_tree), the bench also sweeps the scorer's threshold β (runtime.prune_threshold) at
T=0: the unpruned tree, then each β, on the same prompts against the same plain decoding (`prune_sweep`), and
bench.png plots τ against the verified tokens.

A lossy acceptance rule (a judge: `judge_thresholds`, each δ a greedy run of its own after the exact ones) is
benched with its quality cost beside its speedup: with `check_answers`, every answer is checked by its prompt's
program (answers.py) and each run reports its accuracy and retained accuracy; the plot says `lossless: false`
for the judged runs.

Each run also reports τ by the prompt's length (`tau_by_context`: buckets of CONTEXT_BUCKETS tokens, the table's
last line a run), for drafts meant for long contexts (a windowed draft's τ on 4-8K prompts against its τ on short
ones), and the settings the bytes of the drafter's own state (`draft_state_bytes`: its KV cache, which a windowed
draft keeps the same size at any context length).

What "lossless" compared is in its name: `lossless_float32` (speculative == plain decoding token for token in
float32, on the first `lossless_prompts` prompts: the timed T=0 run itself when it ran float32, else a float32
runtime's; `float32_check` holds the detail) and `<dtype>_matches_plain` (the timed T=0 run in its own dtype,
"7/10": in bf16 a verify of many rows rounds its GEMMs differently from a one-row decode, so a near-tied argmax
can flip there without the runtime being lossy)."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from specdraft.config import EvalConfig
from specdraft.core.console import ticking
from specdraft.data.checks import Check
from specdraft.data.images import load_images
from specdraft.core.errors import Interrupted, SpecdraftError
from specdraft.decoding.stats import acceptance_by_position, cycles_by_position
from specdraft.core.io import write_json
from specdraft.runtime.answers import answer_quality, bench_prompts
from specdraft.runtime.load import Runtime, set_judge_threshold
from specdraft.runtime.plots import device_name, plot_bench
from specdraft.runtime.profile import profile_cycles
from specdraft.targets.vision import PromptInputs, as_prompt, image_model_inputs


CONTEXT_BUCKETS = (1024, 2048, 4096, 8192)
"""Edges (prompt tokens) of the prompt-length buckets `tau_by_context` reports: <1K, 1-2K, 2-4K, 4-8K, >=8K."""

PRUNE_SWEEP_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)
"""The default β sweep of a draft that scores its tree, as multiples of its own β: a classifier trained on balanced
traces cuts near 0.5 (0.25-0.75 swept), one trained on every verified candidate near its acceptance rate (C2T's
0.03: 0.015-0.045)."""


@dataclass
class BenchSettings:
    prompts: str = EvalConfig.prompts
    max_prompts: Optional[int] = None
    max_new_tokens: int = 256
    temperatures: Sequence[float] = (0.0, 1.0)
    seed: int = 0
    hf_baseline: bool = True
    hf_prompts: Optional[int] = None  # HF on the first N prompts alone (None: all); its speedups over those prompts
    trace: bool = False
    lossless_prompts: int = 10  # checked in float32 (`lossless_in_float32`); 0: not checked
    prune_sweep: Optional[Sequence[float]] = None  # β swept where the draft scores its tree (None: around its own
    # β, PRUNE_SWEEP_SCALES times it; (): none)
    judge_thresholds: Sequence[float] = ()  # δ of the draft's judge, one greedy run each after the exact runs
    check_answers: bool = False  # check every answer with its prompt's program (answers.py)
    check_timeout_s: float = 5.0  # time limit of one sandboxed code check
    profile_cycles: int = 16  # cycles the cycle profile times (profile.py); 0: no profile

    def __post_init__(self):
        if self.profile_cycles < 0:
            raise SpecdraftError(f"--profile-cycles must be 0 (no profile) or more, got {self.profile_cycles}")
        if self.hf_prompts is not None and self.hf_prompts < 1:
            raise SpecdraftError(f"--hf-prompts must be at least 1, got {self.hf_prompts} "
                                 f"(--no-hf skips the baseline)")
        bad = [beta for beta in self.prune_sweep or () if not 0.0 <= beta <= 1.0]
        if bad:
            raise SpecdraftError(f"--prune-sweep thresholds must be in [0, 1], got {bad}")


def first_user_turns(runtime: Runtime, prompts: str, max_prompts: Optional[int]) -> List[List[int]]:
    """The first user turn of each prompt (`bench_prompts`), chat template applied -> token ids."""
    return [runtime.encode_chat(text) for text in bench_prompts(prompts, max_prompts)[0]]


def encode_prompts(runtime: Runtime, source: str, max_prompts: Optional[int], with_checks: bool = False
                   ) -> Tuple[List[PromptInputs], Optional[List[Check]]]:
    """`bench_prompts` (the first user turn of each prompt, and with_checks each one's answer check) with its images
    (an image prompt set's, for a vision-language target) -> what the engine takes (`Runtime.prompt`), the checks."""
    turns, checks, images = bench_prompts(source, max_prompts, with_checks)
    return [runtime.prompt(text, load_images(paths)) for text, paths in zip(turns, images)], checks


def _hf_generate(runtime: Runtime, prompt: PromptInputs, max_new_tokens: int, temperature: float) -> List[int]:
    model, device = runtime.target.model, runtime.engine.device
    ids = torch.tensor([prompt.ids], device=device)
    inputs = image_model_inputs(runtime.target.processor, model, ids.cpu(), [prompt.images]) if prompt.images else \
        {"input_ids": ids}
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else \
        {"do_sample": False}
    out = model.generate(**inputs, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         eos_token_id=runtime.eos_ids, pad_token_id=runtime.target.tokenizer.pad_token_id, **sampling)
    return out[0, len(prompt.ids):].tolist()


def _timed(fn, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - started


def run_temperature(runtime: Runtime, prompts: List, settings: BenchSettings, temperature: float,
                    traces: List[dict], plain_results: Optional[list] = None,
                    checks: Optional[List[Check]] = None) -> dict:
    """Both loops over the prompts (token ids or PromptInputs) at `temperature`, by the engine's acceptance rule now
    (and HF generate, asked) -> the run's summary; with `checks`, the answers' quality (answers.py).
    `plain_results`: an empty list is filled with plain decoding's results; a full one (from an earlier run at T=0
    on these prompts) is reused, and only the speculative loop runs."""
    engine, device = runtime.engine, runtime.engine.device
    prompts = [as_prompt(prompt) for prompt in prompts]
    reuse = plain_results is not None and len(plain_results) == len(prompts)
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    n_new = settings.max_new_tokens
    for mode in ("plain", "spec"):  # warm-up: CUDA graphs are captured here, not in a timed run
        run = engine.decode_plain if mode == "plain" else engine.generate
        run(prompts[0].ids, min(32, n_new), runtime.eos_ids, temperature=temperature, generator=generator,
            **prompts[0].engine_kwargs())
    prompt_warmup = warm_prompt_lengths(engine, prompts)
    totals = {"plain": [0, 0.0], "spec": [0, 0.0], "hf": [0, 0.0], "plain@hf": [0, 0.0], "spec@hf": [0, 0.0]}
    accepted, drafted, exits, verify_rows, same_as_plain, plain_matches_hf = [], [], [], [], 0, 0
    answers = {"plain": [], "spec": []}
    per_prompt = []  # each prompt's length, tokens and seconds: its fixed costs (the prefill) apart from a token's
    load_before = host_load()
    for index, prompt in enumerate(ticking(prompts, desc=f"bench T={temperature:g}", unit="prompt")):
        if reuse:
            plain = plain_results[index]
        else:
            plain = engine.decode_plain(prompt.ids, n_new, runtime.eos_ids, temperature=temperature,
                                        generator=generator, **prompt.engine_kwargs())
            if plain_results is not None:
                plain_results.append(plain)
        spec = engine.generate(prompt.ids, n_new, runtime.eos_ids, temperature=temperature, generator=generator,
                               trace=settings.trace, **prompt.engine_kwargs())
        for name, result in (("plain", plain), ("spec", spec)):
            totals[name][0] += len(result.tokens)
            totals[name][1] += result.seconds
        accepted += spec.accepted
        drafted += spec.drafted
        exits += spec.exits
        verify_rows += [rows for rows in spec.verify_rows if rows is not None]
        same_as_plain += spec.tokens == plain.tokens
        answers["plain"].append(plain.tokens)
        answers["spec"].append(spec.tokens)
        per_prompt.append({"prompt_len": len(prompt.ids), "plain_tokens": len(plain.tokens), "plain_s": plain.seconds,
                           "spec_tokens": len(spec.tokens), "spec_cycles": len(spec.accepted), "spec_s": spec.seconds,
                           "spec_cycle_tokens": sum(a + 1 for a in spec.accepted),
                           "diverges_at": divergence(plain.tokens, spec.tokens)})
        traces += [{"temperature": temperature, "prompt": index, "cycle": c, **row} for c, row in enumerate(spec.trace)]
        if settings.hf_baseline and (settings.hf_prompts is None or index < settings.hf_prompts):
            hf_tokens, seconds = _timed(lambda: _hf_generate(runtime, prompt, n_new, temperature), device)
            for name, tokens, took in (("hf", hf_tokens, seconds), ("plain@hf", plain.tokens, plain.seconds),
                                       ("spec@hf", spec.tokens, spec.seconds)):
                totals[name][0] += len(tokens)
                totals[name][1] += took
            plain_matches_hf += hf_tokens == plain.tokens
    summary = _summary(runtime, totals, (accepted, drafted, exits, verify_rows), same_as_plain, plain_matches_hf,
                       len(prompts), temperature, settings)
    if checks is not None:
        decode = lambda tokens: runtime.target.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731
        summary["answers"] = answer_quality(decode, checks, answers["plain"], answers["spec"],
                                            settings.check_timeout_s)
    return {**summary, "tau_by_context": tau_by_context(per_prompt),
            "host_load": {"before": load_before, "after": host_load(), "cpus": os.cpu_count()},
            "prompt_warmup": prompt_warmup, "per_prompt": per_prompt}


def context_bucket(prompt_len: int) -> str:
    """The CONTEXT_BUCKETS bucket of a prompt length: '<1K', '1-2K', ..., '>=8K'."""
    edges = [f"{edge // 1024}K" for edge in CONTEXT_BUCKETS]
    for index, edge in enumerate(CONTEXT_BUCKETS):
        if prompt_len < edge:
            return f"<{edges[0]}" if index == 0 else f"{edges[index - 1][:-1]}-{edges[index]}"
    return f">={edges[-1]}"


def tau_by_context(per_prompt: List[dict]) -> List[dict]:
    """A run's prompts by prompt-length bucket (those it has, shortest first) -> [{bucket, prompts, cycles, tau}]:
    τ is the bucket's cycle tokens (accepted + 1 each cycle) over its cycles."""
    buckets: Dict[str, List[dict]] = {}
    for row in sorted(per_prompt, key=lambda row: row["prompt_len"]):
        buckets.setdefault(context_bucket(row["prompt_len"]), []).append(row)
    return [{"bucket": name, "prompts": len(rows), "cycles": sum(r["spec_cycles"] for r in rows),
             "tau": sum(r["spec_cycle_tokens"] for r in rows) / max(1, sum(r["spec_cycles"] for r in rows))}
            for name, rows in buckets.items()]


def warm_prompt_lengths(engine, prompts: List) -> dict:
    """Every prompt's prefill, twice, before the timed runs -> the mean first and second prefill (ms). The eager
    prefill pays a one-time cost for each prompt length it has not met yet (docs/benchmarks.md: a first pass over
    the prompts decodes slower than every later one), and the timed loop that meets a prompt first, always plain
    decoding, paid it alone. A server pays it once a length, in
    either loop; `bench` times both loops without it and keeps it on record here."""
    device = engine.device
    first, again = [], []
    for prompt in map(as_prompt, prompts):  # token ids or PromptInputs
        prompt_ids = torch.tensor(prompt.ids, device=device)
        for times in (first, again):
            times.append(_timed(lambda: engine.prefill(prompt_ids, 0.0, **prompt.engine_kwargs()), device)[1])
    return {"prompts": len(prompts), "prefill_first_ms": 1000 * sum(first) / len(first),
            "prefill_again_ms": 1000 * sum(again) / len(again)}


def host_load() -> Optional[float]:
    """The host's 1-minute load average, recorded beside each run's rates, so that a reader can tell a bench run
    on an idle host from one run beside other work."""
    try:
        return os.getloadavg()[0]
    except OSError:  # not on every platform
        return None


def _summary(runtime, totals, cycles, same_as_plain, plain_matches_hf, num_prompts, temperature, settings):
    accepted, drafted, exits, verify_rows = cycles
    exit_layers = runtime.engine.drafter.caps.exit_layers
    speed = {name: (tokens / seconds if seconds else None) for name, (tokens, seconds) in totals.items()}
    engine = runtime.engine
    depth = engine.most_tokens - 1  # the most drafts a cycle may accept (a policy's may pass the shape's)
    greedy = temperature == 0
    chain = engine.chain is not None
    acceptance = engine.acceptance(temperature)
    reach = drafted if chain else reachable(engine, temperature, len(accepted))
    return {
        "temperature": temperature,
        "acceptance": acceptance.key,
        "tree": asdict(engine.shape_at(temperature)) if not chain else None,
        "tau": sum(a + 1 for a in accepted) / max(1, len(accepted)),
        "acceptance_by_position": acceptance_by_position(accepted, depth, reach),
        "cycles_by_position": cycles_by_position(accepted, depth, reach),
        "drafted_per_cycle": sum(drafted) / max(1, len(drafted)),
        "verified_per_cycle": 1 + sum(drafted) / max(1, len(drafted)),  # the nodes the target verified, the root too
        "verify_rows_per_cycle": sum(verify_rows) / len(verify_rows) if verify_rows else None,  # padding included
        "prune_threshold": engine.tree_scorer.threshold if engine.tree_scorer is not None else None,
        "prune_at": engine.prune_at if engine.tree_scorer is not None else None,
        "prune_verify": engine.prune_verify if engine.tree_scorer is not None else None,
        "cycles_by_exit_layer": {layer: exits.count(i) for i, layer in enumerate(exit_layers)} if exit_layers else None,
        "accepted_histogram": [accepted.count(a) for a in range(depth + 1)],
        "cycles": len(accepted),
        "tokens_per_s": speed["spec"],
        "tokens_per_s_plain": speed["plain"],
        "tokens_per_s_hf": speed["hf"],
        "speedup_vs_plain": speed["spec"] / speed["plain"],
        "speedup_vs_hf": speed["spec@hf"] / speed["hf"] if speed["hf"] else None,  # over the same prompts
        "plain_vs_hf": speed["plain@hf"] / speed["hf"] if speed["hf"] else None,
        "hf_prompts": min(num_prompts, settings.hf_prompts or num_prompts) if settings.hf_baseline else 0,
        "new_tokens": {name: tokens for name, (tokens, _) in totals.items() if "@" not in name},
        "seconds": {name: seconds for name, (_, seconds) in totals.items() if "@" not in name},
        "lossless": (same_as_plain == num_prompts and acceptance.lossless) if greedy else None,
        "lossless_prompts": same_as_plain if greedy else None,
        "plain_matches_hf_prompts": plain_matches_hf if greedy and settings.hf_baseline else None,
        "prompts": num_prompts,
    }


def divergence(plain: List[int], spec: List[int]) -> Optional[int]:
    """The first position where two answers differ (the shorter one's length when one extends the other), None
    when they are identical."""
    if plain == spec:
        return None
    return next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))


def float32_check_of(run: dict, count: int) -> dict:
    """The float32 check read off a timed float32 run at T=0 (its per-prompt comparison of the two loops)."""
    rows = run["per_prompt"][:count]
    return {"dtype": "float32", "prompts": count, "identical": sum(row["diverges_at"] is None for row in rows),
            "lossless": all(row["diverges_at"] is None for row in rows), "reused_timed_run": True,
            "divergences": [{"prompt": index, "position": row["diverges_at"]} for index, row in enumerate(rows)
                            if row["diverges_at"] is not None]}


def reachable(engine, temperature: float, cycles: int) -> Optional[List[int]]:
    """The draft positions each of a tree run's cycles could reach, as `acceptance_by_position` takes them: the
    fixed tree's depth at `temperature` (a shallower sampling tree reaches fewer positions than the engine's
    deepest: those are no data, not a rate of 0), None under a drafting policy (its depth varies by cycle)."""
    if engine.policy is not None:
        return None
    return [engine.shape_at(temperature).depth] * cycles


def lossless_in_float32(runtime: Runtime, prompts: List, settings: BenchSettings,
                        load_float32: Optional[Callable[[], Runtime]],
                        greedy_run: Optional[dict] = None) -> Optional[dict]:
    """Speculative against plain decoding at T=0, token for token, in float32, on the first
    `settings.lossless_prompts` prompts: in float32 a lossless runtime's two outputs are identical. The timed
    run's own check (`lossless`) is made in its dtype, where a verify of many rows rounds its GEMMs differently
    from a one-row decode, so in bf16 a near-tied argmax can flip (docs/benchmarks.md). When the runtime runs
    float32 and `greedy_run` (its timed, exact T=0 run on these prompts) is given, that run's comparison is the
    check (nothing decoded again); else the runtime itself when it runs float32, or the one `load_float32` builds
    (image prompts made again for it); None when no check is asked or possible. prompts: token ids or
    PromptInputs."""
    count = min(settings.lossless_prompts, len(prompts))
    exact = runtime.engine.dtype == torch.float32
    if count <= 0 or (not exact and load_float32 is None):
        return None
    if exact and greedy_run is not None and len(greedy_run["per_prompt"]) >= count:
        return float32_check_of(greedy_run, count)
    checked = runtime if exact else load_float32()
    set_judge_threshold(checked, None)  # the exact rule: a judge, when on, is benched apart
    engine, identical, divergences = checked.engine, 0, []
    for index, prompt in enumerate(ticking(prompts[:count], desc="lossless check, float32", unit="prompt")):
        prompt = as_prompt(prompt)
        if prompt.images and checked is not runtime:  # its image embeddings, in float32
            prompt = checked.prompt(prompt.text, prompt.images)
        plain = engine.decode_plain(prompt.ids, settings.max_new_tokens, checked.eos_ids, **prompt.engine_kwargs())
        spec = engine.generate(prompt.ids, settings.max_new_tokens, checked.eos_ids, **prompt.engine_kwargs())
        position = divergence(plain.tokens, spec.tokens)
        if position is None:
            identical += 1
        else:
            divergences.append({"prompt": index, "position": position})
    return {"dtype": "float32", "prompts": count, "identical": identical, "lossless": identical == count,
            "reused_timed_run": False, "divergences": divergences}


def run_bench(runtime: Runtime, settings: BenchSettings, out_dir: str | Path,
              load_float32: Optional[Callable[[], Runtime]] = None) -> dict:
    """Bench every temperature of `settings`, then each judge threshold of its sweep (greedy) and, for a draft that
    scores its tree, each β of the prune sweep, then check losslessness in float32 (`lossless_in_float32`, with a
    runtime from `load_float32` when this one runs another dtype); write bench.json (+ bench.png, trace.jsonl)
    under out_dir, at the end: a Ctrl-C before it writes nothing (Interrupted says so)."""
    out = Path(out_dir)
    traces: List[dict] = []
    try:
        report = measure(runtime, settings, traces, load_float32)
    except KeyboardInterrupt:
        raise Interrupted(f"bench stopped before its report: nothing written to {out} (bench.json is written at "
                          f"the end); run the same command again") from None
    write_json(out / "bench.json", report)
    if settings.trace:
        write_json(out / "trace.jsonl", traces)
    plot_bench(report, out / "bench.png")
    return report


def measure(runtime: Runtime, settings: BenchSettings, traces: List[dict],
            load_float32: Optional[Callable[[], Runtime]] = None) -> dict:
    """bench.json's report (every cycle's trace appended to `traces`)."""
    prompts, checks = encode_prompts(runtime, settings.prompts, settings.max_prompts, settings.check_answers)
    plain_at_zero: list = []  # plain decoding at T=0, reused by the judge and β sweeps
    if settings.judge_thresholds:
        set_judge_threshold(runtime, None)  # the temperature runs accept exactly: the sweep's baseline
    runs = [run_temperature(runtime, prompts, settings, t, traces, plain_at_zero if t == 0 else None, checks)
            for t in settings.temperatures]
    sweep = judge_sweep(runtime, prompts, settings, traces, checks, plain_at_zero)
    exact = next((r for r in runs if r["temperature"] == 0), None)
    greedy = exact or runs[0]
    dtype = str(runtime.engine.dtype).replace("torch.", "")
    profile = profile_around(runtime, prompts[0].ids, settings.profile_cycles)
    report = {
        "tau": greedy["tau"], "tokens_per_s": greedy["tokens_per_s"], "speedup_vs_plain": greedy["speedup_vs_plain"],
        "speedup_vs_hf": greedy["speedup_vs_hf"], "lossless_float32": None,
        f"{dtype}_matches_plain": f"{exact['lossless_prompts']}/{exact['prompts']}" if exact else None,
        "runs": runs, "judge_sweep": sweep, "cycle_profile": profile,
        "settings": _settings(runtime, settings),
    }
    if runtime.engine.drafter.caps.scores_tree and settings.prune_sweep != ():
        report["prune_sweep"] = sweep_prune_thresholds(runtime, prompts, settings, plain_at_zero)
    check = lossless_in_float32(runtime, prompts, settings, load_float32, exact)
    report["float32_check"] = check
    report["lossless_float32"] = None if check is None else check["lossless"]
    return report


def profile_around(runtime: Runtime, prompt: List[int], cycles: int) -> Optional[dict]:
    """The cycle profile (profile.py) of `cycles` cycles with the host's load average around it (its two timings
    are minutes apart on a busy CPU), None for 0 cycles."""
    if not cycles:
        return None
    before = host_load()
    profile = profile_cycles(runtime, prompt, cycles)
    return {**profile, "host_load": {"before": before, "after": host_load()}}


def matches_plain_key(report: dict) -> str:
    """The name of the report's own-dtype comparison: `<dtype>_matches_plain`."""
    return f"{report['settings']['dtype']}_matches_plain"


def summary(report: dict) -> dict:
    """What `specdraft bench` prints on stdout: the T=0 (else first) run's τ, speed and speedups, and what was
    compared for losslessness under names that say so."""
    key = matches_plain_key(report)
    return {**{k: report[k] for k in ("tau", "tokens_per_s", "speedup_vs_plain", "speedup_vs_hf",
                                       "lossless_float32")}, key: report[key]}


def judge_sweep(runtime: Runtime, prompts: List, settings: BenchSettings, traces: List[dict],
                checks: Optional[List[Check]], plain_results: list) -> List[dict]:
    """A greedy run at each δ of `settings.judge_thresholds` against the same plain decoding (`plain_results`,
    filled by the first run when empty; no HF baseline), the runtime left accepting exactly after it."""
    runs, judged = [], replace(settings, hf_baseline=False)
    for threshold in settings.judge_thresholds:
        set_judge_threshold(runtime, threshold)
        run_traces: List[dict] = []
        runs.append({"judge_threshold": threshold,
                     **run_temperature(runtime, prompts, judged, 0.0, run_traces, plain_results, checks)})
        traces += [{"judge_threshold": threshold, **row} for row in run_traces]
    set_judge_threshold(runtime, None)
    return runs


def sweep_prune_thresholds(runtime: Runtime, prompts: List, settings: BenchSettings,
                           plain_results: list, thresholds: Optional[Sequence[float]] = None) -> List[dict]:
    """At T=0, the unpruned tree (the draft's tree scorer off), then the scorer at each β of `thresholds`
    (default settings.prune_sweep, else PRUNE_SWEEP_SCALES times the scorer's own β), on the same prompts against
    the same plain decoding (`plain_results`, filled by the first row when empty) -> one summary a row
    (`prune_threshold` None: unpruned). The engine's scorer and its β are restored after."""
    engine = runtime.engine
    betas = settings.prune_sweep if thresholds is None else thresholds
    if betas is None:
        betas = [min(1.0, round(scale * engine.tree_scorer.threshold, 6)) for scale in PRUNE_SWEEP_SCALES]
    return prune_runs(runtime, prompts, settings, plain_results,
                      [None, *((beta, engine.prune_at, engine.prune_verify) for beta in betas)])


def prune_runs(runtime: Runtime, prompts: List, settings: BenchSettings, plain_results: list,
               variants: Sequence[Optional[Tuple[float, str, str]]]) -> List[dict]:
    """At T=0, one run per variant on the same prompts against the same plain decoding (`plain_results`, filled by
    the first run when empty): None the unpruned tree, else (β, prune_at, prune_verify) the draft's tree scorer so
    (RuntimeConfig) -> one summary each. The engine's scorer, its β and the prune options are restored after."""
    engine = runtime.engine
    scorer = engine.drafter.tree_scorer()
    saved, saved_threshold, saved_options = engine.tree_scorer, scorer.threshold, (engine.prune_at,
                                                                                   engine.prune_verify)
    quiet = replace(settings, hf_baseline=False, trace=False)
    rows = []
    try:
        for variant in variants:
            engine.set_tree_scorer(None if variant is None else scorer)
            if variant is not None:
                scorer.threshold = variant[0]
                engine.set_prune_options(*variant[1:])
            rows.append(run_temperature(runtime, prompts, quiet, 0.0, [], plain_results))
    finally:
        scorer.threshold = saved_threshold
        engine.set_prune_options(*saved_options)
        engine.set_tree_scorer(saved)
    return rows


def _settings(runtime: Runtime, settings: BenchSettings) -> Dict:
    engine = runtime.engine
    device = engine.device
    return {"prompts": settings.prompts, "max_prompts": settings.max_prompts,
            "max_new_tokens": settings.max_new_tokens, "seed": settings.seed,
            "judge_thresholds": list(settings.judge_thresholds), "check_answers": settings.check_answers,
            "tree": asdict(engine.shape),
            "sampling_tree": asdict(engine.sampling_shape) if engine.sampling_shape is not None else None,
            "chain": _chain_settings(engine), "policy": runtime.settings.policy, "policy_stats": engine.policy_stats(),
            "sample_drafts": engine.sample_drafts,
            "dtype": str(engine.dtype).replace("torch.", ""), "cuda_graphs": engine.use_graphs,
            "overlap": engine.overlap,
            "device": device_name(device),
            "method": runtime.method, "draft": runtime.draft_source,
            "target": runtime.target.info.name_or_path, "max_len": engine.max_len,
            "draft_state_bytes": draft_state_bytes(engine.drafter)}


def draft_state_bytes(drafter) -> int:
    """The bytes of a drafter's own state (Drafter.state_tensors: its KV caches, prefix length, last state)."""
    return sum(t.numel() * t.element_size() for t in drafter.state_tensors())


def _chain_settings(engine) -> Optional[Dict]:
    if engine.chain is None:
        return None
    return {"exit_threshold": engine.exit_threshold, "dynamic_exit": engine.dynamic_exit is not None,
            "verify_start_layer": engine.chain.start_layer,
            "exit_layers": list(engine.drafter.caps.exit_layers) or None}


def format_table(report: dict) -> str:
    rows = ["| T | tree | τ | verified/cycle | spec tok/s | plain tok/s | HF tok/s | spec/plain | spec/HF | "
            f"plain/HF | spec == plain ({report['settings']['dtype']}) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, p=1: "n/a" if x is None else f"{x:.{p}f}"  # noqa: E731
    for run in report["runs"]:
        tree = run.get("tree")
        shape = "chain" if tree is None else f"{tree['depth']}, {tree['topk']}, {tree['budget']}"
        rows.append(f"| {run['temperature']:g} | {shape} | {run['tau']:.2f} | {run['verified_per_cycle']:.2f} | "
                    f"{fmt(run['tokens_per_s'])} | "
                    f"{fmt(run['tokens_per_s_plain'])} | {fmt(run['tokens_per_s_hf'])} | "
                    f"{fmt(run['speedup_vs_plain'], 2)} | {fmt(run['speedup_vs_hf'], 2)} | "
                    f"{fmt(run['plain_vs_hf'], 2)} | {same_as_plain(run)} |")
    rows += [context_line(run) for run in report["runs"] if len(run.get("tau_by_context") or []) > 1]
    rows += _sweep_rows(report.get("prune_sweep") or [], fmt)
    if report.get("judge_sweep"):
        rows += ["", sweep_table(report)]
    rows += ["", *lossless_lines(report)]
    if report["cycle_profile"] is not None:
        rows += ["", *cycle_lines(report["cycle_profile"])]
    return "\n".join(rows)


def context_line(run: dict) -> str:
    """'τ by prompt length, T=0: <1K 3.21 (12 prompts), 4-8K 3.05 (8 prompts)'."""
    return f"τ by prompt length, T={run['temperature']:g}: " + ", ".join(
        f"{b['bucket']} {b['tau']:.2f} ({b['prompts']} prompt{'s' * (b['prompts'] != 1)})" for b in run["tau_by_context"])


def same_as_plain(run: dict) -> str:
    """A T=0 run's prompts whose speculative answer is plain decoding's, "k/n" (n/a at T > 0: sampled answers
    differ by design)."""
    return "n/a" if run["lossless_prompts"] is None else f"{run['lossless_prompts']}/{run['prompts']}"


def lossless_lines(report: dict) -> List[str]:
    """What the bench compared for losslessness, each line naming its dtype and its prompts."""
    lines = []
    own = report.get(matches_plain_key(report))
    if own is not None:
        lines.append(f"speculative == plain decoding at T=0 in {report['settings']['dtype']} (the timed run): "
                     f"{own} prompts")
    check = report.get("float32_check")
    if check is not None:
        how = "the timed run itself" if check.get("reused_timed_run") else "decoded again in float32"
        lines.append(f"lossless in float32 (speculative == plain, T=0, {how}): {check['identical']}/"
                     f"{check['prompts']} prompts: {'lossless' if check['lossless'] else 'NOT lossless'}")
    return lines


def cycle_lines(profile: dict) -> List[str]:
    """The cycle profile as lines that add up: the phases timed eagerly with a sync between them sum to that
    eager cycle; the cycle as the engine runs it (no syncs between phases, one CUDA graph on a GPU) is another
    measurement, beside it, each phase's share of the eager cycle scaling it."""
    phases = profile["eager_ms"]
    eager = sum(phases.values())
    lines = ["cycle, phase by phase (eager, a sync between phases): " +
             " + ".join(f"{name} {ms:.3f}" for name, ms in phases.items()) + f" = {eager:.3f} ms",
             f"cycle as the engine runs it: {profile['cycle_ms']:.3f} ms (host {profile['cycle_host_ms']:.3f}): no "
             f"sync between phases" + (", one CUDA graph" if profile.get("cuda_graphs") else "") +
             "; shares of the eager cycle: " +
             ", ".join(f"{name} {100 * ms / eager:.0f}%" for name, ms in phases.items() if eager) +
             f"; plain step as run: {profile['plain_step_ms']:.3f} ms (host {profile['plain_host_ms']:.3f})" +
             load_note(profile.get("host_load"))]
    if profile.get("graph_split_ms"):
        split = profile["graph_split_ms"]
        lines.append("cycle, one CUDA graph a phase (device ms, each graph's launch gap included): " +
                     " + ".join(f"{k} {v:.3f}" for k, v in split.items()) + f" = {sum(split.values()):.3f} ms")
    return lines


def load_note(load: Optional[dict]) -> str:
    """'; load average 4.7 -> 5.1' around a measurement (on a shared host the two timings of the profile can
    differ by what else runs), '' when unknown."""
    if not load or load.get("before") is None or load.get("after") is None:
        return ""
    return f"; load average {load['before']:.1f} -> {load['after']:.1f}"


def sweep_table(report: dict) -> str:
    """The exact greedy run, then each judge threshold: τ (and against the exact τ), tokens/s, speedup over plain
    decoding, and with checked answers accuracy and retained accuracy."""
    exact = [run for run in report["runs"] if run["temperature"] == 0][:1]  # none when T=0 was not benched
    exact_tau = exact[0]["tau"] if exact else None
    fmt = lambda x, p=2: "n/a" if x is None else f"{x:.{p}f}"  # noqa: E731
    rows = ["| acceptance | τ | τ / exact τ | spec tok/s | spec/plain | plain accuracy | accuracy | retained "
            "accuracy | identical to plain | lossless |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run in [*exact, *report["judge_sweep"]]:
        answers = run.get("answers") or {}
        name = "exact" if "judge_threshold" not in run else f"judge δ={run['judge_threshold']:g}"
        ratio = fmt(run["tau"] / exact_tau) if exact_tau else "n/a"
        rows.append(f"| {name} | {run['tau']:.2f} | {ratio} | {fmt(run['tokens_per_s'], 1)} | "
                    f"{fmt(run['speedup_vs_plain'])} | {fmt(answers.get('accuracy_plain'), 3)} | "
                    f"{fmt(answers.get('accuracy'), 3)} | {fmt(answers.get('retained_accuracy'), 3)} | "
                    f"{run['lossless_prompts']}/{run['prompts']} | {run['lossless']} |")
    return "\n".join(rows)


def _sweep_rows(sweep: List[dict], fmt) -> List[str]:
    """The β sweep as table lines (none without a sweep)."""
    if not sweep:
        return []
    rows = ["", "| β | verified/cycle | verify rows | τ | spec tok/s | spec/plain | lossless |",
            "|---|---|---|---|---|---|---|"]
    for run in sweep:
        beta = "unpruned" if run["prune_threshold"] is None else f"{run['prune_threshold']:g}"
        rows.append(f"| {beta} | {run['verified_per_cycle']:.2f} | {fmt(run['verify_rows_per_cycle'])} | "
                    f"{run['tau']:.2f} | {fmt(run['tokens_per_s'])} | "
                    f"{fmt(run['speedup_vs_plain'], 2)} | {run['lossless']} |")
    return rows

