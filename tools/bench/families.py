"""Families suite: every target family the verifier runs (decoding/verifier/families/), each as a small random
model built from transformers' own config class (tests/families.py: sliding windows short enough to cut, q/k
norms, Gemma 3's norms and two rotary bases, routed experts), float32, on one device. Per family:

- lossless: the runtime's plain decoding (`SpecEngine.decode_plain`: the verifier, CUDA graphs on a GPU) of
  --prompts random prompts (lengths spread from 1 to past the window), token for token against Hugging Face's
  greedy `generate` of the same model;
- speed: answer tokens/s of the runtime's plain decoding and of HF `generate` (greedy, the same prompt and
  --new-tokens, KV cache on), each after one untimed call, the median of --repeats; `× HF` the ratio.

    python -m tools.bench.families --out OUT                      # every family, on the GPU
    python -m tools.bench.families --families gemma3 qwen3_moe --out OUT
    python -m tools.bench.families --quick --device cpu --out OUT  # the test models, a few tokens: the code path

Writes OUT/families.json (rewritten after each family, so an interrupted run keeps the ones done).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, List, Optional

import torch

from tools.bench.suite import finish, fmt, machine, markdown_table, write_report

SIZES = {  # COMMON's overrides (tests/families.py) per size; windows cut every prompt and answer of the suite
    "small": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024),
    "tiny": {},
}
WINDOWS = {"small": 32, "tiny": 8}


def synced(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_tokens_per_s(run: Callable[[], int], device: torch.device, repeats: int) -> float:
    """Median tokens/s of run() (which returns the answer tokens it made) over `repeats` calls, after one untimed."""
    run()
    rates = []
    for _ in range(repeats):
        synced(device)
        started = time.perf_counter()
        tokens = run()
        synced(device)
        rates.append(tokens / (time.perf_counter() - started))
    return statistics.median(rates)


def hf_greedy(model, prompt: List[int], new_tokens: int) -> List[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def random_prompts(count: int, longest: int, vocab: int, seed: int) -> List[List[int]]:
    """`count` prompts of lengths spread over 1..longest (the first the longest), random tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [longest] + torch.randint(1, longest + 1, (count - 1,), generator=generator).tolist()
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def family_row(family: str, args, device: torch.device) -> dict:
    """Build `family`'s model, check the runtime's plain decoding against HF greedy, time both."""
    from specdraft.core.types import TargetInfo
    from specdraft.decoding.engine import SpecEngine
    from specdraft.decoding.shapes import TreeShape
    from specdraft.decoding.verifier import from_hf, hf_rope_tables
    from tests.families import tiny_family

    model = tiny_family(family, seed=0, window=WINDOWS[args.size], **SIZES[args.size]).to(device)
    config = model.config
    info = TargetInfo.from_hf_config(config, f"random {family}")
    max_len = args.prompt_len + args.new_tokens + 8
    engine = SpecEngine(from_hf(model, info), None, TreeShape.chain(1), max_len, hf_rope_tables(model, max_len))
    prompts = random_prompts(args.prompts, args.prompt_len, config.vocab_size, seed=1)
    identical = sum(engine.decode_plain(prompt, args.new_tokens).tokens == hf_greedy(model, prompt, args.new_tokens)
                    for prompt in prompts)
    prompt = prompts[0]
    runtime_rate = timed_tokens_per_s(lambda: len(engine.decode_plain(prompt, args.new_tokens).tokens), device,
                                      args.repeats)
    hf_rate = timed_tokens_per_s(lambda: len(hf_greedy(model, prompt, args.new_tokens)), device, args.repeats)
    row = {"family": family, "model_type": info.model_type,
           "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
           "sliding_window": getattr(config, "sliding_window", None), "identical": identical,
           "prompts": len(prompts), "lossless": identical == len(prompts),
           "runtime_tokens_per_s": round(runtime_rate, 1), "hf_tokens_per_s": round(hf_rate, 1),
           "x_hf": round(runtime_rate / hf_rate, 2), "cuda_graphs": engine.use_graphs}
    del engine, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def table(rows: List[dict]) -> str:
    return markdown_table(
        ["family", "model type", "params (M)", "window", "runtime == HF greedy", "runtime tokens/s",
         "HF generate tokens/s", "× HF"],
        [[r["family"], r["model_type"], f"{r['parameters_m']:.2f}", fmt(r["sliding_window"], "d"),
          f"{r['identical']}/{r['prompts']}", f"{r['runtime_tokens_per_s']:,.1f}", f"{r['hf_tokens_per_s']:,.1f}",
          f"{r['x_hf']:.2f}"] for r in rows])


def main(argv: Optional[List[str]] = None) -> dict:
    from tests.families import FAMILIES

    parser = argparse.ArgumentParser(description="every target family: the runtime's float32 plain decoding "
                                                 "against HF greedy, and its tokens/s against HF generate's")
    parser.add_argument("--families", nargs="+", default=FAMILIES, choices=FAMILIES)
    parser.add_argument("--size", default="small", choices=sorted(SIZES), help="the models' sizes")
    parser.add_argument("--prompts", type=int, default=10, help="prompts checked against HF greedy")
    parser.add_argument("--prompt-len", type=int, default=96, help="the longest prompt (the timed one)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per engine (the median is reported)")
    parser.add_argument("--quick", action="store_true",
                        help="the test models, 3 prompts, 12 tokens, one repeat: a check that the suite runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.prompts, args.prompt_len, args.new_tokens, args.repeats = "tiny", 3, 12, 12, 1
    device = torch.device(args.device)
    report = {"machine": machine(args.device), "dtype": "float32", "size": args.size, "prompts": args.prompts,
              "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats, "rows": []}
    with torch.no_grad():
        for family in args.families:
            report["rows"].append(family_row(family, args, device))
            row = report["rows"][-1]
            print(f"{family}: {row['identical']}/{row['prompts']} identical, {row['runtime_tokens_per_s']} tokens/s "
                  f"against HF's {row['hf_tokens_per_s']} ({row['x_hf']}x)", flush=True)
            write_report(args.out, report, "families")
    return finish(table(report["rows"]), args.out, report, "families")


if __name__ == "__main__":
    main()
