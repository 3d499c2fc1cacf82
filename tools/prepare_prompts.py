"""Build the benchmark's training prompt mix from ../shared/data (not shipped, not committed).

Writes OUT_DIR/train_prompts.jsonl (alpaca, ShareGPT, GSM8K train: OpenAI `messages` form, first user turn)
and copies MT-bench's question.jsonl beside it, for `.data/` to travel to the GPU machine.

    python tools/prepare_prompts.py --shared ../shared/data --out .data --per-source 1600,1200,600,600
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from specdraft.data.sources import load_conversations

SOURCES = ("alpaca/alpaca_5000.json", "sharegpt/ShareGPT_V3_filtered_1000.json",
           "sharegpt/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json", "gsm8k/train.jsonl",
           "sharegpt/ShareGPT_V3_filtered_500.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default="../shared/data")
    parser.add_argument("--out", default=".data")
    parser.add_argument("--per-source", default="1600,1200,600,600,0", help="prompts taken from each source")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", default=None, help="a train_prompts.jsonl whose prompts are left out")
    parser.add_argument("--name", default="train_prompts.jsonl")
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
            first_user = next(m for m in conversation.messages if m["role"] == "user")
            rows.append({"messages": [first_user], "origin": f"{rel}#{conversation.index}"})
    rng.shuffle(rows)
    with open(out / args.name, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    shutil.copy(Path(args.shared) / "mt_bench" / "question.jsonl", out / "mt_bench.jsonl")
    print(f"{len(rows)} training prompts -> {out / args.name}")


if __name__ == "__main__":
    main()
