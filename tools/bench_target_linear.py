"""What DeepSpeed's ZeRO-3 linear costs the frozen target's forward on the host, and what `torch_linear` saves
(issue 7). CPU only.

ZeRO-3 (its default `memory_efficient_linear`) replaces `torch.nn.functional.linear` process-wide with an autograd
Function, and leaves it replaced. Every linear of the frozen target then paid a Python Function call, argument
binding by `inspect.signature` included, though the target runs under no_grad. `capture_features` now runs the
target under `specdraft.targets.features.torch_linear`, PyTorch's own op.

A random Llama target with Llama-3.1-8B's 32 layers (so its 224 linears per forward) at a tiny width and a short
row, so that the forward is bound by the host, runs under no_grad with DeepSpeed's linear installed: as
`capture_features` ran before (`deepspeed`), and as it runs now (`torch_linear`), alternating step by step so that
both see the same host. Prints each one's median main-thread CPU ms per forward (and p90) and the linear calls
that went through DeepSpeed's Function; writes OUT/bench_target_linear.json.

    python tools/bench_target_linear.py --steps 200 --out runs/target_linear
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def random_target(layers: int, hidden: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def counting(linear, calls: list):
    def counted(input, weight, bias=None):
        calls.append(1)
        return linear(input, weight, bias)
    return counted


def measure(steps: int, layers: int, hidden: int, tokens: int) -> dict:
    """-> {variant: {"cpu_ms_each": [...], "deepspeed_linear_calls": per forward}}."""
    import torch.nn.functional as F
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    from specdraft.targets.features import _run_decoder, capture_features, causal_attention

    model = random_target(layers, hidden)
    ids = torch.randint(0, 512, (1, tokens), generator=torch.Generator().manual_seed(0))  # [1, T]
    calls: list = []
    F.linear = counting(zero3_linear_wrap, calls)  # as ZeRO-3 leaves the process

    def deepspeed():  # capture_features as it was before torch_linear
        with torch.no_grad(), causal_attention(model):
            _run_decoder(model.get_decoder(), ids, None, None, [0, 2, layers // 2, layers - 3])

    def torch_linear():
        capture_features(model, ids, None, [2, layers // 2, layers - 3])

    variants = {"deepspeed": deepspeed, "torch_linear": torch_linear}
    results = {name: {"cpu_ms_each": [], "deepspeed_linear_calls": 0} for name in variants}
    try:
        for step in range(steps):
            for name, forward in variants.items():
                calls.clear()
                started = time.thread_time()
                forward()
                results[name]["cpu_ms_each"].append(1e3 * (time.thread_time() - started))
                results[name]["deepspeed_linear_calls"] = len(calls)
    finally:
        F.linear = torch._C._nn.linear
    return results


def table(results: dict) -> str:
    lines = [f"{'variant':>13} {'CPU ms/forward':>15} {'p90':>7} {'DeepSpeed linear calls':>23}"]
    for name, result in results.items():
        lines.append(f"{name:>13} {result['cpu_ms_median']:>15.2f} {result['cpu_ms_p90']:>7.2f} "
                     f"{result['deepspeed_linear_calls']:>23}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10, help="forwards of each variant left out of the statistics")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error(f"--steps must exceed --warmup ({args.warmup})")
    torch.set_num_threads(1)
    results = measure(args.steps, args.layers, args.hidden, args.tokens)
    for result in results.values():
        timed = sorted(result["cpu_ms_each"][args.warmup:])
        result["cpu_ms_median"] = statistics.median(timed)
        result["cpu_ms_p90"] = timed[min(len(timed) - 1, int(0.9 * len(timed)))]
    print(table(results))
    report = {**vars(args), "out": str(args.out), "results": results}
    from specdraft.core.io import write_json

    write_json(args.out / "bench_target_linear.json", report)
    print(f"-> {args.out / 'bench_target_linear.json'}")
    return report


if __name__ == "__main__":
    main()
