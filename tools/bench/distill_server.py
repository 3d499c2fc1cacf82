"""Server-engine suite: `distill-data` with distill.engine=server against llama.cpp's OpenAI-compatible server
(llama-cpp-python serving the embedded SmolLM2 GGUF on the CPU, specdraft/testing/llama_server.py), beside what
that server delivers on its own.

`throughput`: the same first-turn prompts, templated, asked by a plain concurrent client (a pool of --concurrency
threads posting each templated prompt with the sampling fields distill-data sends, greedy) and by distill-data (in
this process, the same concurrency, --shard-size prompts a shard), interleaved A B A B (the plain client first in
each pair) for --rounds pairs against one running server.
Each side's answer tokens per second from its first request to its last answer (distill-data's throughput.json:
generation only, no tokenizer loading or merge), the ratio distill-data / plain (specdraft must add no bottleneck:
the goal is at least 90%), medians over the rounds, and how many answers both sides agree on. The load average
before and after is recorded: the CPU may be shared.

`nothing-lost`: distill-data with the server killed (SIGKILL) at a random moment of the run --kills times, each
time brought back and the run started again, then once more to the end: every prompt accounted exactly once
(ok + error + skipped = input, each conversation once in the dataset), and which shards each run kept.

    python -m tools.bench.distill_server --num-prompts 48 --max-new-tokens 64 --concurrency 8 --out runs/bench
    python -m tools.bench.distill_server throughput --rounds 3 --out runs/bench     # one part
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

from specdraft.testing.llama_server import SMOLLM2, LlamaServer, missing_reason
from tools.bench.suite import fmt, machine, markdown_table, run_parts, write_report

TOPICS = ["the sea", "a city at night", "bread", "rain", "a library", "mountains", "a train", "music", "winter",
          "a garden", "the moon", "coffee", "a river", "friendship", "a market", "the desert"]
FORMS = ["Write two sentences about {}.", "Describe {} in a short paragraph.", "Give three facts about {}."]


def prompts(count: int) -> List[dict]:
    """`count` distinct single-turn prompts (topics x forms, numbered past the first round)."""
    made = []
    for i in range(count):
        text = FORMS[i % len(FORMS)].format(TOPICS[(i // len(FORMS)) % len(TOPICS)])
        made.append({"prompt": text if i < len(TOPICS) * len(FORMS) else f"{text} (variant {i})"})
    return made


def load_average() -> List[float]:
    return [round(value, 2) for value in os.getloadavg()]


def write_inputs(args) -> Path:
    """OUT/prompts.jsonl -> the recipe (OUT/recipe.yaml) that both parts distill with."""
    args.out.mkdir(parents=True, exist_ok=True)
    prompt_file = args.out / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in prompts(args.num_prompts)))
    recipe = args.out / "recipe.yaml"
    recipe.write_text(f"target: {{path: '{SMOLLM2}'}}\nmethod: {{name: eagle3}}\n"
                      f"data: {{prompts: [{prompt_file}], max_length: 2048}}\n"
                      f"distill: {{max_new_tokens: {args.max_new_tokens}, shard_size: {args.shard_size}, "
                      f"engine: server, server: {{url: 'http://127.0.0.1:1', concurrency: {args.concurrency}}}}}\n")
    return recipe


def _recipe(args, url: str, out: Path, overrides=()):
    from specdraft.recipes import load_recipe

    return load_recipe(args.recipe, [f"distill.server.url={url}", f"distill.output_dir={out}", *overrides])


def templated(args) -> List[str]:
    """Each prompt as distill-data sends it to a text server: its chat template applied, as text."""
    from specdraft.config import TargetConfig
    from specdraft.targets.chat import TextChat
    from specdraft.targets.load import load_chat_tokenizer

    tokenizer = load_chat_tokenizer(TargetConfig(path=SMOLLM2))[0]
    chat = TextChat(tokenizer)
    texts = []
    for record in prompts(args.num_prompts):
        ids = chat.ids([{"role": "user", "content": record["prompt"]}], add_generation_prompt=True)
        texts.append(tokenizer.decode(ids, skip_special_tokens=False))
    return texts


def plain_client(server: LlamaServer, texts: List[str], args) -> dict:
    """The server alone: every prompt posted by a pool of --concurrency threads -> tokens/s, first send to last
    answer, and the answers."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        choices = list(pool.map(lambda text: server.complete(text, args.max_new_tokens), texts))
    seconds = time.perf_counter() - started
    tokens = sum(choice["usage"].get("completion_tokens", 0) for choice in choices)
    return {"side": "plain client", "answer_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "answers": [choice["text"] for choice in choices]}


def distill_side(server: LlamaServer, args, out: Path) -> dict:
    """distill-data through the server, in this process, into a fresh `out` -> its throughput and answers."""
    from specdraft.distill.run import run_distill

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    counts = run_distill(_recipe(args, server.url, out))
    wall = time.perf_counter() - started
    merged = json.loads((out / "throughput.json").read_text())
    return {"side": "distill-data", "counts": counts, "answer_tokens": merged["generated_tokens"],
            "seconds": merged["generate_seconds"], "tokens_per_s": merged["tokens_per_s"], "run_seconds": wall,
            "latency_p50_s": merged["server"]["latency_p50_s"], "latency_p90_s": merged["server"]["latency_p90_s"],
            "answers": dataset_answers(out)}


def dataset_answers(out: Path) -> List[str]:
    """Each conversation's answer text, in conversation order, from a distilled dataset."""
    from datasets import load_from_disk

    from specdraft.config import TargetConfig
    from specdraft.targets.load import load_chat_tokenizer

    tokenizer = load_chat_tokenizer(TargetConfig(path=SMOLLM2))[0]
    rows = sorted(load_from_disk(str(out / "dataset")), key=lambda row: row["index"])
    masked = [tokenizer.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]) for row in rows]
    return [text[:-len("<|im_end|>\n")] if text.endswith("<|im_end|>\n") else text for text in masked]


def throughput(args) -> dict:
    """A B A B: plain client, then distill-data, --rounds times, against one server -> rounds and medians."""
    texts = templated(args)
    rounds = []
    with LlamaServer(n_ctx=args.n_ctx, threads=args.threads, log=args.out / "server.log") as server:
        server.complete(texts[0], 4)  # warm: the model paged in, the first prompt evaluated once
        for index in range(args.rounds):
            plain = plain_client(server, texts, args)
            distilled = distill_side(server, args, args.out / "throughput" / f"round-{index}")
            same = sum(a == b for a, b in zip(plain.pop("answers"), distilled.pop("answers")))
            rounds.append({"round": index, "plain": plain, "distill": distilled, "same_answers": same,
                           "ratio": distilled["tokens_per_s"] / plain["tokens_per_s"], "load_average": load_average()})
            print(f"round {index}: plain {plain['tokens_per_s']:.1f} tok/s, distill-data "
                  f"{distilled['tokens_per_s']:.1f} tok/s ({100 * rounds[-1]['ratio']:.0f}%)", flush=True)
    plain_median = statistics.median(r["plain"]["tokens_per_s"] for r in rounds)
    distill_median = statistics.median(r["distill"]["tokens_per_s"] for r in rounds)
    return {"rounds": rounds, "plain_tokens_per_s": plain_median, "distill_tokens_per_s": distill_median,
            "ratio": distill_median / plain_median, "ratio_median_of_rounds": statistics.median(
                r["ratio"] for r in rounds)}


def _run_until_killed(args, out: Path, delay: float) -> dict:
    """One distill-data run with its server killed `delay` seconds in -> what it kept and how it stopped."""
    from specdraft.distill.run import run_distill

    outcome = {}
    server = LlamaServer(n_ctx=args.n_ctx, threads=args.threads, log=args.out / "server.log").start()

    def run():
        try:
            outcome["counts"] = run_distill(_recipe(args, server.url, out, ["distill.server.retries=2",
                                                                              "distill.server.backoff=0.5"]))
        except Exception as err:  # noqa: BLE001 (the stop the kill causes is the point; any other is reported)
            outcome["stopped"] = f"{type(err).__name__}: {err}"

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=delay)
    killed = worker.is_alive()
    server.kill()
    worker.join()
    server.stop()
    shards = sorted(path.name for path in (out / "shards").glob("shard-*")) if (out / "shards").is_dir() else []
    return {"kill_after_s": round(delay, 2), "killed_mid_run": killed, "shards_kept": len(shards), **outcome}


def nothing_lost(args, run_seconds: float) -> dict:
    """--kills runs, each killed at a random moment (uniform over 90% of what `run_seconds`, a whole run's time,
    leaves for the shards still missing), then one to the end."""
    from datasets import load_from_disk

    out = args.out / "nothing_lost"
    shutil.rmtree(out, ignore_errors=True)
    draw, shards = random.Random(args.seed), -(-args.num_prompts // args.shard_size)
    runs = []
    for _ in range(args.kills):
        missing = shards - (len(list((out / "shards").glob("shard-*"))) if (out / "shards").is_dir() else 0)
        runs.append(_run_until_killed(args, out, draw.uniform(1.0, max(1.0, 0.9 * run_seconds * missing / shards))))
    with LlamaServer(n_ctx=args.n_ctx, threads=args.threads, log=args.out / "server.log") as server:
        from specdraft.distill.run import run_distill

        counts = run_distill(_recipe(args, server.url, out))
    indices = [row["index"] for row in load_from_disk(str(out / "dataset"))]
    accounted = counts["ok"] + counts["error"] + counts["skipped"]
    return {"runs": runs, "final_counts": counts, "every_prompt_once": accounted == counts["input"] == args.num_prompts
            and sorted(indices) == sorted(set(indices)) and len(indices) == counts["ok"]}


def throughput_table(result: dict) -> str:
    rows = [[r["round"], f"{r['plain']['tokens_per_s']:.1f}", f"{r['distill']['tokens_per_s']:.1f}",
             f"{100 * r['ratio']:.1f}%", f"{r['same_answers']}", fmt(r["distill"]["latency_p50_s"], ".2f"),
             fmt(r["distill"]["latency_p90_s"], ".2f"), " ".join(map(str, r["load_average"]))]
            for r in result["rounds"]]
    rows.append(["median", f"{result['plain_tokens_per_s']:.1f}", f"{result['distill_tokens_per_s']:.1f}",
                 f"{100 * result['ratio']:.1f}%", "", "", "", ""])
    return markdown_table(["round", "plain client tok/s", "distill-data tok/s", "distill / plain", "same answers",
                           "latency p50 s", "latency p90 s", "load average"], rows)


def nothing_lost_table(result: dict) -> str:
    rows = [[i, r["kill_after_s"], "yes" if r["killed_mid_run"] else "no (finished)", r["shards_kept"],
             (r.get("stopped") or "").replace("SpecdraftError: ", "").split("; distill-data stopped")[0][:140]]
            for i, r in enumerate(result["runs"])]
    counts = result["final_counts"]
    rows.append(["resume", "-", "-", "all", f"{counts} -> every prompt once: {result['every_prompt_once']}"])
    return markdown_table(["run", "server killed after s", "killed mid-run", "shards kept", "how it stopped"], rows)


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="distill-data through llama.cpp's server vs the server alone")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight, both sides")
    parser.add_argument("--shard-size", type=int, default=16, help="distill.shard_size (shard boundaries included)")
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs of the throughput part")
    parser.add_argument("--kills", type=int, default=3, help="server kills of the nothing-lost part")
    parser.add_argument("--threads", type=int, default=2, help="the server's CPU threads")
    parser.add_argument("--n-ctx", type=int, default=1024, help="the server's context")
    parser.add_argument("--seed", type=int, default=0, help="draws the kill moments")
    parser.add_argument("--out", type=Path, required=True, help="a directory: OUT/distill_server.json and the runs")
    args = parser.parse_args(argv)
    reason = missing_reason()
    if reason:
        parser.error(reason)
    args.recipe = write_inputs(args)
    return args


def _report(args) -> dict:
    return {"machine": machine("cpu"), "server": "llama-cpp-python (llama_cpp.server), SmolLM2-135M-Instruct Q4_1",
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "recipe")},
            "load_average_start": load_average()}


def _finish(report: dict, tables: List[str], args) -> dict:
    report["load_average_end"] = load_average()
    text = "\n\n".join(tables) + f"\n\nload average (1, 5, 15 min): start {report['load_average_start']}, end " \
                                 f"{report['load_average_end']}; {report['machine']}"
    print(text)
    print(f"-> {write_report(args.out, report, 'distill_server')}")
    return report


def run_throughput(argv=None) -> dict:
    args = parse_args(argv)
    report = _report(args)
    report["throughput"] = throughput(args)
    return _finish(report, [throughput_table(report["throughput"])], args)


def run_nothing_lost(argv=None, run_seconds: float = 0.0) -> dict:
    args = parse_args(argv)
    report = _report(args)
    report["nothing_lost"] = nothing_lost(args, run_seconds or _estimate_run_seconds(args))
    return _finish(report, [nothing_lost_table(report["nothing_lost"])], args)


def _estimate_run_seconds(args) -> float:
    """How long one distill-data run takes here, for drawing kill moments: one run timed."""
    with LlamaServer(n_ctx=args.n_ctx, threads=args.threads, log=args.out / "server.log") as server:
        return distill_side(server, args, args.out / "estimate")["run_seconds"]


def run_all(argv=None) -> dict:
    args = parse_args(argv)
    report = _report(args)
    report["throughput"] = throughput(args)
    write_report(args.out, report, "distill_server")
    run_seconds = statistics.median(r["distill"]["run_seconds"] for r in report["throughput"]["rounds"])
    report["nothing_lost"] = nothing_lost(args, run_seconds)
    return _finish(report, [throughput_table(report["throughput"]), nothing_lost_table(report["nothing_lost"])],
                   args)


def main(argv=None):
    return run_parts({"all": run_all, "throughput": run_throughput, "nothing-lost": run_nothing_lost}, argv)


if __name__ == "__main__":
    main()
