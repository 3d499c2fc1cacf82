"""Build the benchmark's training prompt mix from ../shared/data (not shipped, not committed).

Writes OUT_DIR/train_prompts.jsonl (alpaca, ShareGPT, GSM8K train: OpenAI `messages` form, first user turn),
copies MT-bench's question.jsonl beside it (mt_bench.jsonl) and splits Spec-Bench's questions by task
(spec_bench_<task>.jsonl: translation, summarization, qa, math_reasoning, rag, and mt_bench, its MT-bench
categories together), and copies GSM8K's train.jsonl and test.jsonl into OUT_DIR/gsm8k/ (the judge recipes'
`gsm8k:.data/gsm8k/...` task sets: mined on train, benched on test), for `.data/` to travel to the GPU machine (or
runs/prompts/ for recipes/c2t_smollm2.yaml).
With `--code N` it also writes code_prompts.jsonl: up to N programming prompts of the alpaca and ShareGPT sets that
train_prompts.jsonl leaves out (the code recipes' second set; HumanEval stays an evaluation set). With `--long` it
also writes the long-context evaluation sets (tools/long_prompts.py): long_prompts.jsonl (4-7K tokens) and
long_prompts_1k.jsonl (768-1,023), `--long-count` prompts each, measured by SmolLM2's tokenizer (`--long-target`).

    python -m tools.prepare_prompts --shared ../shared/data --out .data --per-source 1600,1200,600,600 --code 600
    python -m tools.prepare_prompts --shared ../shared/data --out .data --long
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path

from specdraft.data.sources import load_conversations

SPEC_BENCH_TASKS = ("translation", "summarization", "qa", "math_reasoning", "rag")
"""Spec-Bench's tasks besides MT-bench (whose questions it files under MT-bench's own categories)."""
SOURCES = ("alpaca/alpaca_5000.json", "sharegpt/ShareGPT_V3_filtered_1000.json",
           "sharegpt/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json", "gsm8k/train.jsonl",
           "sharegpt/ShareGPT_V3_filtered_500.json")
CODE_SOURCES = tuple(source for source in SOURCES if not source.startswith("gsm8k/"))
CODE_REQUEST = re.compile(
    r"```|\bdef \w+\(|\bfunction\s*\w*\s*\(|#include\b|^\s*(import|from) [\w.]+|=>|\b\w+\(\)"
    r"|\b(python|javascript|typescript|c\+\+|c#|golang|sql|bash|php|kotlin|html|css|regex|node\.?js|react|django"
    r"|numpy|pandas|java)\b"
    r"|\b(write|implement|create|generate|fix|debug|refactor|optimi[sz]e|explain|convert)\b[^.?!\n]{0,60}"
    r"\b(code|function|script|program|class|method|query|algorithm|api|snippet)s?\b",
    re.IGNORECASE | re.MULTILINE)
"""A programming prompt: a code block or code syntax, a programming language or library named, or a request to
write, fix or explain code."""


def split_spec_bench(question_file: Path, out: Path) -> dict:
    """Spec-Bench's question.jsonl -> OUT/spec_bench_<task>.jsonl, one file a task (MT-bench's categories as
    mt_bench) -> {task: questions}."""
    by_task = {}
    for line in question_file.read_text().splitlines():
        if line.strip():
            category = json.loads(line)["category"]
            by_task.setdefault(category if category in SPEC_BENCH_TASKS else "mt_bench", []).append(line)
    for task, lines in by_task.items():
        (out / f"spec_bench_{task}.jsonl").write_text("\n".join(lines) + "\n")
    return {task: len(lines) for task, lines in by_task.items()}


GSM8K_FILES = ("train.jsonl", "test.jsonl")


def copy_gsm8k(shared: Path, out: Path) -> Path:
    """SHARED/gsm8k/{train,test}.jsonl -> OUT/gsm8k/ (unchanged: the task set reads GSM8K's own records)."""
    folder = out / "gsm8k"
    folder.mkdir(parents=True, exist_ok=True)
    for name in GSM8K_FILES:
        shutil.copyfile(shared / "gsm8k" / name, folder / name)
    return folder


def first_user_turn(conversation) -> dict:
    return next(m for m in conversation.messages if m["role"] == "user")


def code_rows(shared: Path, left_out: set, count: int, rng: random.Random) -> list:
    """Up to `count` programming prompts (CODE_REQUEST) of CODE_SOURCES whose origins are not in `left_out`."""
    found = []
    for rel in CODE_SOURCES:
        for conversation in load_conversations([str(shared / rel)]):
            origin = f"{rel}#{conversation.index}"
            if conversation.skip_reason is None and origin not in left_out and \
                    CODE_REQUEST.search(first_user_turn(conversation)["content"]):
                found.append({"messages": [first_user_turn(conversation)], "origin": origin})
    return rng.sample(found, min(count, len(found)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default="../shared/data")
    parser.add_argument("--out", default=".data")
    parser.add_argument("--per-source", default="1600,1200,600,600,0", help="prompts taken from each source")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", default=None, help="a train_prompts.jsonl whose prompts are left out")
    parser.add_argument("--name", default="train_prompts.jsonl")
    parser.add_argument("--code", type=int, default=0, help="also write code_prompts.jsonl: up to this many "
                                                             "programming prompts that the training mix leaves out")
    parser.add_argument("--long", action="store_true", help="also write long_prompts.jsonl (4-7K tokens) and "
                                                                 "long_prompts_1k.jsonl (tools/long_prompts.py)")
    parser.add_argument("--long-count", type=int, default=40, help="prompts in each long-context set")
    parser.add_argument("--long-target", default=None, help="the target whose tokenizer measures them "
                                                            "(default: SmolLM2-135M-Instruct's GGUF)")
    args = parser.parse_args()
    counts = [int(c) for c in args.per_source.split(",")]
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    excluded = set()
    if args.exclude:
        excluded = {json.loads(line)["origin"] for line in open(args.exclude)}
    for rel, count in zip(SOURCES, counts):
        usable = [c for c in load_conversations([str(Path(args.shared) / rel)])
                  if c.skip_reason is None and f"{rel}#{c.index}" not in excluded]
        for conversation in rng.sample(usable, min(count, len(usable))):
            rows.append({"messages": [first_user_turn(conversation)], "origin": f"{rel}#{conversation.index}"})
    rng.shuffle(rows)
    with open(out / args.name, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    shutil.copy(Path(args.shared) / "mt_bench" / "question.jsonl", out / "mt_bench.jsonl")
    tasks = split_spec_bench(Path(args.shared) / "spec_bench" / "question.jsonl", out)
    print(f"GSM8K train and test -> {copy_gsm8k(Path(args.shared), out)}")
    print("Spec-Bench: " + ", ".join(f"{task} {count}" for task, count in tasks.items()) + f" -> {out}")
    print(f"{len(rows)} training prompts -> {out / args.name}")
    if args.code:
        code = code_rows(Path(args.shared), excluded | {row["origin"] for row in rows}, args.code, rng)
        with open(out / "code_prompts.jsonl", "w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in code)
        print(f"{len(code)} code prompts -> {out / 'code_prompts.jsonl'}")
    if args.long:
        from tools.long_prompts import SMOLLM2, write_long_sets

        paths = write_long_sets(Path(args.shared), out, args.long_count, args.seed, args.long_target or SMOLLM2)
        print("long-context prompts -> " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
