"""Compile the exact Triton launches the launchers make at runtime shapes for an sm_90a GPU (H100/H200), without
a GPU: `python -m tests.kernels.sm90` prints one JSON report per launch (kernel, registers, spilled bytes).

`record_launches` swaps a module's kernels for recorders while a launcher runs on CPU tensors (nothing is
executed); `compile_sm90` compiles each recorded launch as the JIT would (same signature, constexprs, num_warps,
16-divisibility hints) down to a cubin with Triton's bundled ptxas. This catches what the interpreter cannot:
code that does not compile for the GPU, and register spills. Run it without TRITON_INTERPRET (the interpreter
replaces the kernels by Python functions).
"""
import contextlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import torch

_POINTER_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int64: "*i64",
                  torch.int32: "*i32", torch.uint8: "*u8", torch.bool: "*i1"}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


@dataclass
class Launch:
    kernel: object  # the triton.JITFunction
    args: tuple
    kwargs: dict = field(default_factory=dict)


class _Recorder:
    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(Launch(self.kernel, args, kwargs))


@contextlib.contextmanager
def record_launches(module, *kernel_names: str):
    """Within the block, launching `module.<name>[grid](...)` records the launch instead of running it."""
    launches = []
    originals = {name: getattr(module, name) for name in kernel_names}
    try:
        for name, kernel in originals.items():
            setattr(module, name, _Recorder(kernel, launches))
        yield launches
    finally:
        for name, kernel in originals.items():
            setattr(module, name, kernel)


def _arg_type(value) -> tuple[str, bool]:
    """(triton signature type, divisible by 16) of a runtime argument."""
    if isinstance(value, torch.Tensor):
        return _POINTER_TYPES[value.dtype], True  # torch allocations are 16-byte aligned
    if isinstance(value, bool):
        return "i1", False
    if isinstance(value, int):
        return ("i32" if -2 ** 31 <= value < 2 ** 31 else "i64"), value % 16 == 0
    if isinstance(value, float):
        return "fp32", False
    raise TypeError(f"unexpected kernel argument {value!r}")


def _ptxas() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_sm90(launch: Launch) -> dict:
    """-> {"name", "registers", "spill_bytes"} of the launch compiled for sm_90a."""
    import triton
    from triton.backends.compiler import GPUTarget

    names = launch.kernel.arg_names
    constexprs = {k: v for k, v in launch.kwargs.items() if k not in _LAUNCH_OPTIONS}
    runtime = dict(zip(names, launch.args))
    signature, attrs = {}, {}
    for index, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name], divisible = _arg_type(runtime[name])
        if divisible:
            attrs[(index,)] = [["tt.divisibility", 16]]
    options = {k: v for k, v in launch.kwargs.items() if k in _LAUNCH_OPTIONS}
    source = triton.compiler.ASTSource(fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as handle:
            handle.write(compiled.asm["ptx"])
        report = subprocess.run([_ptxas(), "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.o")],
                                capture_output=True, text=True, check=True).stderr
    return {"name": launch.kernel.__name__,
            "registers": int(re.search(r"Used (\d+) registers", report).group(1)),
            "spill_bytes": sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report))}


def _cases():
    """(module, kernel names, launcher call) at SmolLM2-135M and Llama-3-8B shapes, bfloat16."""
    from specdraft.kernels.draft_topk import triton_kernel as topk
    from specdraft.kernels.kv_compact import triton_kernel as compact
    from specdraft.kernels.tree_attention import triton_kernel as attention
    from specdraft.kernels.tree_verify import triton_kernel as verify

    bf16, i64 = torch.bfloat16, torch.int64
    one = torch.ones(1, dtype=i64)
    for rows, vocab in [(64, 32000), (1, 128256)]:
        yield topk, ["_chunk_topk_kernel", "_merge_topk_kernel"], lambda rows=rows, vocab=vocab: topk.draft_topk_triton(
            torch.empty(rows, vocab, dtype=bf16), torch.empty(vocab, dtype=i64), 16)
    nodes = torch.empty(64, dtype=i64)
    yield verify, ["_chunk_argmax_kernel", "_walk_kernel"], lambda: verify.verify_greedy_triton(
        torch.empty(64, 152064, dtype=bf16), nodes, nodes, 12)
    cache = torch.empty(32, 8, 2048, 128, dtype=bf16)
    for entries in (16, 64):
        yield compact, ["_compact_kernel"], lambda entries=entries: compact.compact_kv_triton(
            cache, cache, torch.arange(entries), one, one)
    for q_heads, kv_heads, num_nodes, head_dim, seq_len in [(32, 8, 64, 128, 2048), (32, 8, 1, 128, 2048),
                                                            (9, 3, 64, 64, 2048), (8, 1, 1, 128, 8192)]:
        def run(q_heads=q_heads, kv_heads=kv_heads, num_nodes=num_nodes, head_dim=head_dim, seq_len=seq_len):
            kv = torch.empty(kv_heads, seq_len, head_dim, dtype=bf16)
            attention.tree_attention_triton(torch.empty(q_heads, num_nodes, head_dim, dtype=bf16), kv, kv, one,
                                            torch.ones(num_nodes, num_nodes, dtype=torch.bool), 0.1)
        yield attention, ["_split_kernel", "_combine_kernel"], run
    yield from _layer_cases()
    yield from _moe_cases()


def _moe_cases():
    """grouped_experts: Qwen3-30B-A3B's experts (bfloat16) at a decoding step and a 64-node verify, and float32 at
    sizes that are not multiples of the inner step."""
    from specdraft.kernels.grouped_experts import triton_kernel as experts

    names = ["_route_kernel", "_gate_up_kernel", "_down_kernel", "_sum_kernel"]
    for rows, hidden, inter, num_experts, top_k, dtype in [(1, 2048, 768, 128, 8, torch.bfloat16),
                                                           (64, 2048, 768, 128, 8, torch.bfloat16),
                                                           (16, 1000, 300, 8, 2, torch.float32)]:
        def run(rows=rows, hidden=hidden, inter=inter, num_experts=num_experts, top_k=top_k, dtype=dtype):
            experts.grouped_experts_triton(
                torch.empty(rows, hidden, dtype=dtype), torch.empty(num_experts, 2 * inter, hidden, dtype=dtype),
                torch.empty(num_experts, hidden, inter, dtype=dtype), torch.zeros(rows, top_k, dtype=torch.int64),
                torch.empty(rows, top_k))
        yield experts, names, run


def _layer_cases():
    """The decoder-layer ops: rms_norm, rope_cache, silu_mul (bfloat16, SmolLM2-135M and Llama-3-8B shapes)."""
    from specdraft.kernels.rms_norm import triton_kernel as norm
    from specdraft.kernels.rope_cache import triton_kernel as rope
    from specdraft.kernels.silu_mul import triton_kernel as silu

    bf16, i64 = torch.bfloat16, torch.int64
    for rows, hidden, residual in [(64, 4096, True), (1, 576, False)]:
        x = torch.empty(rows, hidden, dtype=bf16)
        yield norm, ["_rms_norm_kernel"], lambda x=x, residual=residual: norm.rms_norm_triton(
            x, torch.empty(x.shape[1], dtype=bf16), 1e-5, x if residual else None, weight_in_fp32=not residual)
    for tokens, q_heads, kv_heads, head_dim, copies in [(64, 9, 3, 64, None), (1, 32, 8, 128, None),
                                                        (8, 32, 8, 128, 3)]:
        def run(tokens=tokens, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, copies=copies):
            cache = torch.empty(*(() if copies is None else (copies,)), kv_heads, 2048, head_dim, dtype=bf16)
            q = torch.empty(tokens, q_heads, head_dim, dtype=bf16)
            kv = torch.empty(tokens, kv_heads, head_dim, dtype=bf16)
            table, index = torch.empty(2048, head_dim, dtype=bf16), torch.zeros(tokens, dtype=i64)
            rope.rope_cache_triton(q, kv, kv, table, table, index, cache, cache, index)
        yield rope, ["_rope_cache_kernel"], run
    for rows, width in [(64, 14336), (1, 1536)]:
        yield silu, ["_silu_mul_kernel"], lambda rows=rows, width=width: silu.silu_mul_triton(
            *torch.empty(rows, 2 * width, dtype=bf16).chunk(2, dim=-1))


def main() -> None:
    from unittest import mock

    from specdraft.kernels import launch

    with mock.patch.object(launch, "target_programs", lambda device: 2 * 132):  # a 132-SM H100
        for module, kernel_names, run in _cases():
            with record_launches(module, *kernel_names) as launches:
                run()
            assert [recorded.kernel.__name__ for recorded in launches] == kernel_names, launches
            for recorded in launches:
                print(json.dumps(compile_sm90(recorded)), flush=True)


if __name__ == "__main__":
    main()
