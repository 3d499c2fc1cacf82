"""Families suite: every target family the verifier runs (decoding/verifier/families/), each as a small random
model built from transformers' own config class (specdraft/testing/families.py: sliding windows short enough to
cut, q/k norms, Gemma 3's norms and two rotary bases, routed experts), float32, on one device. Per family, the
parts (--parts, all by default):

- lossless: the runtime's plain decoding (`SpecEngine.decode_plain`: the verifier, CUDA graphs on a GPU) of
  --prompts random prompts (lengths spread from 1 to past the window), token for token against Hugging Face's
  greedy `generate` of the same model;
- speed: answer tokens/s of the runtime's plain decoding and of HF `generate` (greedy, the same prompt and
  --new-tokens, KV cache on), each after one untimed call, the median of --repeats; `× HF` the ratio;
- static: distill-data's static batched engine (decoding/batched.py: the verifier's weights, a static KV cache,
  CUDA graphs on a GPU) against HF `generate` on the same --batch random prompts of lengths 1 to --prompt-len, at
  the same batch size (HF: one left-padded batch with its attention mask), greedy, KV cache on, no EOS: every
  answer is --new-tokens long on both sides. Answer tokens/s of each (each after one untimed call, the median of
  --repeats) and `static × HF`; how many of the batch's answers are identical token for token, and, for
  --single-rows of its rows (shortest to longest prompt), whether the static answer is HF's greedy answer to that
  prompt alone (no padding).

    python -m tools.bench.families --out OUT                      # every family, every part, on the GPU
    python -m tools.bench.families --families gemma3 qwen3_moe --out OUT
    python -m tools.bench.families --parts static --batch 256 --out OUT   # the static engine at batch 256 alone
    python -m tools.bench.families --quick --device cpu --out OUT  # the test models, a few tokens: the code path

Writes OUT/families.json (rewritten after each family, so an interrupted run keeps the ones done).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from tools.bench.suite import finish, fmt, machine, markdown_table, write_report

SIZES = {  # COMMON's overrides (specdraft/testing/families.py) per size; windows cut every prompt and answer
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024),
    "tiny": {},
}
WINDOWS = {"small": 32, "tiny": 8}
PAD_ID = 0  # random_prompts never draws it


def synced(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_calls(run: Callable[[], object], device: torch.device, repeats: int) -> Tuple[float, object]:
    """(median seconds of run() over `repeats` calls after one untimed, the last call's result)."""
    result = run()
    seconds = []
    for _ in range(repeats):
        synced(device)
        started = time.perf_counter()
        result = run()
        synced(device)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def timed_tokens_per_s(run: Callable[[], int], device: torch.device, repeats: int) -> float:
    """Median tokens/s of run() (which returns the answer tokens it made) over `repeats` calls, after one untimed."""
    seconds, tokens = timed_calls(run, device, repeats)
    return tokens / seconds


def answer_tokens(answers: List[List[int]]) -> int:
    return sum(len(answer) for answer in answers)


def hf_batch_greedy(model, prompts: List[List[int]], new_tokens: int) -> List[List[int]]:
    """HF greedy `generate` of the prompts as one left-padded batch, exactly `new_tokens` each (no EOS)."""
    from specdraft.targets.generate import left_pad

    ids, attention_mask = left_pad(prompts, PAD_ID, model.device)  # [B, T]
    out = model.generate(ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=PAD_ID, use_cache=True)
    return out[:, ids.shape[1]:].tolist()  # [B, new_tokens]


def hf_greedy(model, prompt: List[int], new_tokens: int) -> List[int]:
    return hf_batch_greedy(model, [prompt], new_tokens)[0]  # one prompt: no padding


def random_prompts(count: int, longest: int, vocab: int, seed: int) -> List[List[int]]:
    """`count` prompts of lengths spread over 1..longest (the first the longest), random tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [longest] + torch.randint(1, longest + 1, (count - 1,), generator=generator).tolist()
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def spread_rows(prompts: List[List[int]], count: int) -> List[int]:
    """Indices of `count` prompts (at most all), spread from the shortest (the most padded in a batch) to the
    longest, in that order."""
    by_length = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    count = min(count, len(prompts))
    if count < 2:
        return by_length[:count]
    return [by_length[round(k * (len(prompts) - 1) / (count - 1))] for k in range(count)]  # steps of >= 1: distinct


def plain_engine(model, info, args):
    """The runtime's engine for plain decoding of `model` (no drafter), room for the suite's longest sequence."""
    from specdraft.decoding.engine import SpecEngine
    from specdraft.decoding.shapes import TreeShape
    from specdraft.decoding.verifier import from_hf, hf_rope_tables

    max_len = args.prompt_len + args.new_tokens + 8
    return SpecEngine(from_hf(model, info), None, TreeShape.chain(1), max_len, hf_rope_tables(model, max_len))


def lossless_part(model, info, args, device: torch.device) -> dict:
    """The runtime's plain decoding of --prompts prompts against HF greedy, token for token."""
    engine = plain_engine(model, info, args)
    prompts = random_prompts(args.prompts, args.prompt_len, model.config.vocab_size, seed=1)
    identical = sum(engine.decode_plain(prompt, args.new_tokens).tokens == hf_greedy(model, prompt, args.new_tokens)
                    for prompt in prompts)
    return {"identical": identical, "prompts": len(prompts), "lossless": identical == len(prompts),
            "cuda_graphs": engine.use_graphs}


def speed_part(model, info, args, device: torch.device) -> dict:
    """Answer tokens/s of the runtime's plain decoding and of HF generate on the longest prompt."""
    engine = plain_engine(model, info, args)
    prompt = random_prompts(args.prompts, args.prompt_len, model.config.vocab_size, seed=1)[0]
    runtime_rate = timed_tokens_per_s(lambda: len(engine.decode_plain(prompt, args.new_tokens).tokens), device,
                                      args.repeats)
    hf_rate = timed_tokens_per_s(lambda: len(hf_greedy(model, prompt, args.new_tokens)), device, args.repeats)
    return {"runtime_tokens_per_s": round(runtime_rate, 1), "hf_tokens_per_s": round(hf_rate, 1),
            "x_hf": round(runtime_rate / hf_rate, 2), "cuda_graphs": engine.use_graphs}


def static_part(model, info, args, device: torch.device) -> dict:
    """distill-data's static engine against HF generate on one batch of --batch prompts: tokens/s and answers."""
    from specdraft.decoding.batched import batched_generator

    prompts = random_prompts(args.batch, args.prompt_len, model.config.vocab_size, seed=2)
    generator = batched_generator(model, info, args.batch)
    # no EOS on either side, so both make batch x new_tokens answer tokens
    static_s, static = timed_calls(lambda: generator.generate(prompts, args.new_tokens, eos_ids=()), device,
                                   args.repeats)
    hf_s, hf = timed_calls(lambda: hf_batch_greedy(model, prompts, args.new_tokens), device, args.repeats)
    static_rate, hf_rate = answer_tokens(static) / static_s, answer_tokens(hf) / hf_s
    alone = spread_rows(prompts, args.single_rows)
    return {"static_batch": len(prompts), "static_identical": sum(s == h for s, h in zip(static, hf)),
            "static_single_identical": sum(static[i] == hf_greedy(model, prompts[i], args.new_tokens) for i in alone),
            "static_single_rows": len(alone), "static_tokens_per_s": round(static_rate, 1),
            "hf_batch_tokens_per_s": round(hf_rate, 1), "static_x_hf": round(static_rate / hf_rate, 2),
            "static_cuda_graphs": generator.decoder.use_graphs}


class Part(NamedTuple):
    measure: Callable[..., dict]  # (model, info, args, device) -> the row's fields
    columns: List[Tuple[str, Callable[[dict], str]]]  # (header, cell of a row)
    summary: Callable[[dict], str]  # the row's line as the suite goes


PARTS: Dict[str, Part] = {
    "lossless": Part(lossless_part, [("runtime == HF greedy", lambda r: f"{r['identical']}/{r['prompts']}")],
                     lambda r: f"{r['identical']}/{r['prompts']} identical"),
    "speed": Part(speed_part, [("runtime tokens/s", lambda r: f"{r['runtime_tokens_per_s']:,.1f}"),
                               ("HF generate tokens/s", lambda r: f"{r['hf_tokens_per_s']:,.1f}"),
                               ("× HF", lambda r: f"{r['x_hf']:.2f}")],
                  lambda r: f"{r['runtime_tokens_per_s']} tokens/s against HF's {r['hf_tokens_per_s']} ({r['x_hf']}x)"),
    "static": Part(static_part,
                   [("static == HF batch", lambda r: f"{r['static_identical']}/{r['static_batch']}"),
                    ("static == HF alone", lambda r: f"{r['static_single_identical']}/{r['static_single_rows']}"),
                    ("static tokens/s", lambda r: f"{r['static_tokens_per_s']:,.1f}"),
                    ("HF batch tokens/s", lambda r: f"{r['hf_batch_tokens_per_s']:,.1f}"),
                    ("static × HF", lambda r: f"{r['static_x_hf']:.2f}")],
                   lambda r: f"static at batch {r['static_batch']}: {r['static_identical']}/{r['static_batch']} "
                             f"rows identical, {r['static_tokens_per_s']} tokens/s against HF's "
                             f"{r['hf_batch_tokens_per_s']} ({r['static_x_hf']}x)"),
}
MODEL_COLUMNS = [("family", lambda r: r["family"]), ("model type", lambda r: r["model_type"]),
                 ("params (M)", lambda r: f"{r['parameters_m']:.2f}"),
                 ("window", lambda r: fmt(r["sliding_window"], "d"))]


def family_row(family: str, args, device: torch.device) -> dict:
    """Build `family`'s model and run each of args.parts on it."""
    from specdraft.core.types import TargetInfo
    from specdraft.testing.families import tiny_family

    model = tiny_family(family, seed=0, window=WINDOWS[args.size], **SIZES[args.size]).to(device)
    config = model.config
    info = TargetInfo.from_hf_config(config, f"random {family}")
    row = {"family": family, "model_type": info.model_type,
           "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
           "sliding_window": getattr(config, "sliding_window", None)}
    for part in args.parts:
        row.update(PARTS[part].measure(model, info, args, device))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def table(rows: List[dict], parts: List[str]) -> str:
    columns = MODEL_COLUMNS + [column for part in parts for column in PARTS[part].columns]
    return markdown_table([header for header, _ in columns], [[cell(r) for _, cell in columns] for r in rows])


def summary(row: dict, parts: List[str]) -> str:
    return f"{row['family']}: " + ", ".join(PARTS[part].summary(row) for part in parts)


def main(argv: Optional[List[str]] = None) -> dict:
    from specdraft.testing.families import FAMILIES

    parser = argparse.ArgumentParser(description="every target family: the runtime's float32 plain decoding "
                                                 "against HF greedy, its tokens/s against HF generate's, and "
                                                 "distill-data's static engine against HF generate at a batch size")
    parser.add_argument("--families", nargs="+", default=FAMILIES, choices=FAMILIES)
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                        help="what to measure per family (all by default)")
    parser.add_argument("--size", default="small", choices=sorted(SIZES), help="the models' sizes")
    parser.add_argument("--prompts", type=int, default=10, help="prompts checked against HF greedy (lossless)")
    parser.add_argument("--prompt-len", type=int, default=96, help="the longest prompt (the one speed times)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per engine (the median is reported)")
    parser.add_argument("--batch", type=int, default=256,
                        help="static: prompts, and rows of the static engine and of HF generate's batch")
    parser.add_argument("--single-rows", type=int, default=3,
                        help="static: rows also checked against HF greedy of their prompt alone")
    parser.add_argument("--quick", action="store_true",
                        help="the test models, 3 prompts, a batch of 8, 12 tokens, one repeat: a check that the "
                             "suite runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.prompts, args.prompt_len, args.new_tokens, args.repeats = "tiny", 3, 12, 12, 1
        args.batch = 8
    args.parts = [part for part in PARTS if part in args.parts]  # the suite's order, each once
    device = torch.device(args.device)
    report = {"machine": machine(args.device), "dtype": "float32", "size": args.size, "parts": args.parts,
              "prompts": args.prompts, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
              "repeats": args.repeats, "batch": args.batch, "rows": []}
    with torch.no_grad():
        for family in args.families:
            report["rows"].append(family_row(family, args, device))
            print(summary(report["rows"][-1], args.parts), flush=True)
            write_report(args.out, report, "families")
    return finish(table(report["rows"], args.parts), args.out, report, "families")


if __name__ == "__main__":
    main()
