"""Quantization suite, three tables.

`training` (the default part): what an 8/4-bit bitsandbytes frozen target (target.quantization=8bit|4bit, training
features only) costs in simulated τ, on existing distilled data. For each setting (none, 8bit, 4bit) it trains the
recipe's draft from scratch with the same data, split, seed and steps (online features from the target at that
setting), then measures held-out simulated τ twice: as the trainer logs it (val/tau_sim: the teacher is the target
at that setting) and against the unquantized target (the one a server runs the draft beside). Each setting runs
in its own process, so peak GPU memory is its own. Prints a table of every setting measured in WORK so far (this
call's and earlier calls', so that settings can run in separate calls) and writes WORK/quantization.json.

    python -m tools.bench.quantization RECIPE --work WORK [--settings none,8bit,4bit] [--steps 400]
        [--micro-batch 16] [key=value ...]

On the GPU, with SmolLM2 and distilled data already at $HOME/work/data (the acceptance suite's WORK/data), about
2-3 minutes a setting on an H200 (add --settings none, then 8bit, then 4bit to keep each call short):
    python -m tools.bench.quantization recipes/eagle3_smollm2.yaml --work $HOME/work/quant \\
        target.path=$HOME/smol/SmolLM2-135M-Instruct.Q4_1.gguf distill.output_dir=$HOME/work/data \\
        data.max_length=1024 data.val_fraction=0.02

`decode`: plain decoding of a random target of a real geometry (default Llama-3.1-8B's) in the runtime, bf16
against its weight-only int8 and int4 quantizations (target.quantization=int8|int4: `kernels.quant_linear`): the
plain step's CUDA graph replayed back to back (ms a step), `decode_plain`'s rate, the bytes a step reads (every
weight once, one embedding row, the KV cache at the mean position) over the step's time, and that as a share of
the card's nominal memory bandwidth and of a device-to-device copy's measured in the same run. OUT/decode.json.

    python -m tools.bench.quantization decode [--geometry llama3-8b] [--tokens 256] --out OUT

`heads`: a head trained on the full-precision target against one trained on its int4 quantization, both decoding
for the int4 target. For each of none and int4 it distills the recipe's prompts with the target at that setting
(the quantized target's own answers), trains the recipe's head (its features), exports it (WORK/SETTING/: a
rerun skips what is done), then benches at T=0 (`specdraft bench`'s run_bench: the default tree, plain decoding
of the same target in the same run, the first --lossless-prompts prompts again in float32 with the weights
dequantized, speculative against plain token for token): the full-precision head on the full-precision target
(the reference), then both heads on the int4 target; with --intermediate EXPORT (a Kangaroo export of the
target) the int4 head once more with hierarchical drafting. OUT/heads.json.

    python -m tools.bench.quantization heads RECIPE --work WORK --out OUT [--steps 200] [--micro-batch 16]
        [--prompts FILE] [--max-prompts 20] [--max-new-tokens 256] [--intermediate EXPORT] [key=value ...]

`all`: `decode` (--tokens 128), then `heads`, each in its own process (one failing leaves the other's table). On
an H100 or H200 with SmolLM2 (tools/gpu/README.md: the GGUF at $GGUF; `.data/` carried, with train_prompts.jsonl
from tools/prepare_prompts.py and mt_bench.jsonl), about 4 minutes:

    python3 -m tools.bench.quantization all recipes/eagle3_smollm2.yaml --work $HOME/work/qt --out $OUT \\
        --prompts .data/mt_bench.jsonl target.path=$GGUF 'data.prompts=[.data/train_prompts.jsonl]' \\
        data.max_samples=1024 distill.batch_size=256 distill.shard_size=512
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

from tools.bench.suite import child_env, finish, fmt, machine, markdown_table, run_parts, write_report

import torch

SETTINGS = ("none", "8bit", "4bit")
GEOMETRIES = {  # TargetInfo fields of the random targets `decode` builds
    "llama3-8b": dict(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=14336, vocab_size=128256),
    "smollm2": dict(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536,
                    vocab_size=49152),
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                 vocab_size=320),
}
NOMINAL_GBPS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0}  # by the card's name (first match): HBM peak
DECODE_WEIGHTS = ("bf16", "int8", "int4")
HEAD_SETTINGS = ("none", "int4")  # the target each head is trained on


def _gib(num_bytes: float) -> float:
    return num_bytes / 2 ** 30


def target_memory_gib(recipe) -> float:
    """GPU memory the frozen target's weights take at recipe.target.quantization (0 on the CPU)."""
    from specdraft.targets import load_target

    if not torch.cuda.is_available():
        return 0.0
    before = torch.cuda.memory_allocated()
    target = load_target(recipe.target, "cuda", quantize=True)
    if recipe.target.quantization == "none":
        target.model.to(torch.bfloat16)  # as training holds it
    used = torch.cuda.memory_allocated() - before
    del target
    torch.cuda.empty_cache()
    return _gib(used)


def tau_against_unquantized(recipe, run_dir: Path) -> dict:
    """Validation metrics of run_dir/last's draft with the unquantized target as the teacher (same split)."""
    import dataclasses

    import lightning as L
    from safetensors.torch import load_file

    from specdraft.methods import get_method
    from specdraft.core.types import DraftContext
    from specdraft.targets import load_target
    from specdraft.train.data import DistilledData, answer_token_counts, load_distilled, split_distilled
    from specdraft.train.module import DraftModule
    from specdraft.train.trainer import lightning_precision

    recipe = dataclasses.replace(recipe, target=dataclasses.replace(recipe.target, quantization="none"))
    distill_dirs = [recipe.distill.output_dir, *recipe.train.extra_distilled]
    dataset = load_distilled(distill_dirs)
    train_idx, val_idx = split_distilled(distill_dirs, len(dataset), recipe.data.val_fraction, recipe.train.seed)
    target = load_target(recipe.target, "cpu")
    ctx = DraftContext(target=target.info, token_counts=answer_token_counts(dataset, train_idx, target.info.vocab_size))
    module = DraftModule(get_method(recipe.method_name), recipe.method, recipe.train, ctx, target.model)
    module.configure_model()
    module.draft.load_state_dict(load_file(run_dir / "last" / "draft.safetensors"))
    module.features.setup(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    trainer = L.Trainer(accelerator="auto", devices=1, precision=lightning_precision(recipe.train), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(module, datamodule=DistilledData(dataset, recipe.data, recipe.train, train_idx, val_idx),
                               verbose=False)[0]
    return {name: float(value) for name, value in metrics.items()}


def run_setting(recipe_path: str, setting: str, work: Path, steps: int, micro_batch: int, overrides: list) -> dict:
    """Train one setting from scratch and measure it (runs inside the child process)."""
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    run_dir = work / setting
    recipe = load_recipe(recipe_path, [*overrides, f"target.quantization={setting}", "data.features=online",
                                       f"train.output_dir={run_dir}", f"train.max_steps={steps}",
                                       f"train.micro_batch_size={micro_batch}", f"train.val_every_steps={steps}",
                                       "train.resume=null"])
    target_gib = target_memory_gib(recipe)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    summary = run_train(recipe)
    seconds = time.perf_counter() - started
    peak = _gib(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0.0
    logged = json.loads((run_dir / "last" / "meta.json").read_text())["metrics"]
    unquantized = tau_against_unquantized(recipe, run_dir)
    return {"setting": setting, "target_weights_gib": target_gib, "train_peak_gib": peak, "train_seconds": seconds,
            "tokens_per_s": summary["tokens_per_s"], "steps": summary["steps"], "micro_batch": micro_batch,
            "val_rows": summary["val_rows"],
            "val_tau_sim_logged": logged.get("val/tau_sim"), "val_tau_sim_vs_unquantized": unquantized["val/tau_sim"],
            "val_acc1_vs_unquantized": unquantized.get("val/acc@1")}


def table(rows: list) -> str:
    return markdown_table(
        ["setting", "target GiB", "peak GiB", "tokens/s", "train s", "val τ_sim (logged)", "val τ_sim vs bf16"],
        [[row["setting"], f"{row['target_weights_gib']:.3f}", f"{row['train_peak_gib']:.2f}",
          f"{row['tokens_per_s']:,.0f}", f"{row['train_seconds']:.0f}", f"{row['val_tau_sim_logged']:.3f}",
          f"{row['val_tau_sim_vs_unquantized']:.3f}"] for row in rows])


def recipe_parser(description: str, work: str, steps: int) -> argparse.ArgumentParser:
    """A part that trains: the recipe and its overrides (before or after the options: parse_intermixed_args), WORK,
    the training steps and micro-batch."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    parser.add_argument("--work", default=work)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--micro-batch", type=int, default=16)
    return parser


def training_main(argv=None) -> dict:
    parser = recipe_parser("what an 8/4-bit frozen target costs in simulated τ", "runs/bench/quantization", 400)
    parser.add_argument("--settings", default="none,8bit,4bit")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child process: run this setting, write its JSON
    args = parser.parse_intermixed_args(argv)
    work = Path(args.work)
    if args.one:
        result = run_setting(args.recipe, args.one, work, args.steps, args.micro_batch, args.overrides)
        return {"path": str(write_report(work / f"{args.one}.json", result, args.one))}
    for setting in args.settings.split(","):
        command = [sys.executable, "-m", "tools.bench.quantization", args.recipe, *args.overrides, "--work", str(work),
                   "--one", setting, "--steps", str(args.steps), "--micro-batch", str(args.micro_batch)]
        if subprocess.run(command, env=child_env()).returncode != 0:
            raise SystemExit(f"setting {setting} failed")
    rows = [json.loads((work / f"{s}.json").read_text()) for s in SETTINGS if (work / f"{s}.json").is_file()]
    result = {"machine": machine(), "torch": torch.__version__, "steps": args.steps, "micro_batch": args.micro_batch,
              "recipe": args.recipe, "overrides": args.overrides, "settings": rows}
    return finish(table(rows), work, result, "quantization")


# ---- decode: a random target's plain decoding, bf16 against int8 and int4 ------------------------------------
def random_target(geometry: str, weights: str, max_len: int, device: torch.device):
    """A compact VerifierModel of GEOMETRIES[geometry] with random bf16 weights (float32 on the CPU), quantized to
    `weights` (int8, int4) or not (bf16)."""
    from specdraft.core.types import TargetInfo
    from specdraft.decoding.verifier import VerifierModel, quantized_verifier

    info = TargetInfo(name_or_path=f"random {geometry}", model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0,
                      max_position_embeddings=max_len, **GEOMETRIES[geometry])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device("meta"):  # then made where it runs, in its dtype: no float32 copy of 8B weights
        model = VerifierModel(info).to(dtype).eval().requires_grad_(False)
    model.to_empty(device=device)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(1.0) if param.dim() == 1 else param.uniform_(-0.03, 0.03)
    return model if weights == "bf16" else quantized_verifier(model, weights)


def step_bytes(model, context: int) -> int:
    """Bytes one decode step reads: every weight but the embedding table once, one embedding row, and the KV cache
    of `context` positions."""
    tensors = [*model.parameters(), *(b for name, b in model.named_buffers() if "probe" not in name)]
    weights = sum(t.numel() * t.element_size() for t in tensors)
    embedding = model.embed_tokens.weight
    info = model.info
    kv = 2 * info.num_layers * info.num_kv_heads * info.head_dim * context * embedding.element_size()
    return weights - embedding.numel() * embedding.element_size() + embedding[0].numel() * embedding.element_size() + kv


def _synced_ms(device: torch.device, run, repeats: int) -> float:
    """ms a call of run() over `repeats` calls back to back (after one untimed call)."""
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1000 * (time.perf_counter() - started) / repeats


def copy_gbps(device: torch.device) -> Optional[float]:
    """A device-to-device copy of 2 GiB, read and written: the bandwidth a kernel can reach here (None on CPUs)."""
    if device.type != "cuda":
        return None
    src = torch.empty(2 ** 30, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = _synced_ms(device, lambda: dst.copy_(src), 10)
    return 2 * src.numel() * src.element_size() / (ms / 1000) / 1e9


def nominal_gbps(device: torch.device) -> Optional[float]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return next((gbps for card, gbps in NOMINAL_GBPS.items() if card in name), None)


def time_plain_decoding(model, tokens: int, prompt_len: int) -> Dict[str, float]:
    """The plain step's graph replayed `tokens` times after a prompt's prefill (ms a step), and decode_plain's rate."""
    from specdraft.decoding.engine import SpecEngine
    from specdraft.decoding.tree import TreeShape
    from specdraft.layers import rope_cos_sin

    info, device = model.info, model.device
    max_len = prompt_len + tokens + 8
    rope = rope_cos_sin(torch.arange(max_len, device=device), info.head_dim, info.rope_theta, model.dtype)
    engine = SpecEngine(model, None, TreeShape.chain(1), max_len, rope)
    prompt = torch.randint(0, info.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    result = engine.decode_plain(prompt, tokens)  # captures the step's graph, then decodes
    result = engine.decode_plain(prompt, tokens)
    step = engine.plain_stepper(engine.root.clone())
    engine.prefill(torch.tensor(prompt, device=device), 0.0)
    token = engine.root.clone()
    step_ms = _synced_ms(device, lambda: step(token), tokens)
    return {"step_ms": step_ms, "tokens_per_s": len(result.tokens) / result.seconds}


def decode_row(geometry: str, weights: str, tokens: int, prompt_len: int, device: torch.device) -> dict:
    model = random_target(geometry, weights, prompt_len + tokens + 8, device)
    timed = time_plain_decoding(model, tokens, prompt_len)
    read = step_bytes(model, prompt_len + tokens // 2)
    row = {"weights": weights, "bytes_a_step": read, **timed, "gbps": read / (timed["step_ms"] / 1000) / 1e9}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _share(part: float, whole: Optional[float]) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def decode_table(rows: List[dict], peak: Optional[float], copy: Optional[float]) -> str:
    base = next((r["step_ms"] for r in rows if r["weights"] == "bf16"), None)
    return markdown_table(
        ["weights", "GiB a step", "ms a step (graph)", "tokens/s (decode_plain)", "GB/s", "of nominal peak",
         "of copy bandwidth", "× bf16"],
        [[r["weights"], f"{_gib(r['bytes_a_step']):.2f}", f"{r['step_ms']:.3f}", f"{r['tokens_per_s']:,.1f}",
          f"{r['gbps']:,.1f}", _share(r["gbps"], peak), _share(r["gbps"], copy),
          fmt(base and base / r["step_ms"], ".2f")] for r in rows])


def decode_main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="plain decoding of a random target: bf16 against int8 and int4")
    parser.add_argument("--geometry", default="llama3-8b", choices=sorted(GEOMETRIES))
    parser.add_argument("--weights", default=",".join(DECODE_WEIGHTS))
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="runs/bench")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    peak, copy = nominal_gbps(device), copy_gbps(device)
    rows = [decode_row(args.geometry, weights, args.tokens, args.prompt_len, device)
            for weights in args.weights.split(",")]
    report = {"machine": machine(args.device), "torch": torch.__version__, "geometry": args.geometry,
              "tokens": args.tokens, "prompt_len": args.prompt_len, "nominal_gbps": peak, "copy_gbps": copy,
              "rows": rows}
    return finish(decode_table(rows, peak, copy), args.out, report, "decode")


# ---- heads: trained on the full-precision target or on its int4 quantization, decoding for the int4 target ------
def trained_head(recipe_path: str, setting: str, work: Path, args, overrides: List[str]) -> Path:
    """Distill with the target at `setting`, train the recipe's head on it, export it -> the export (WORK/SETTING/;
    each stage skipped where its output is there)."""
    from specdraft.distill.run import run_distill
    from specdraft.export import export_draft
    from specdraft.recipes import load_recipe
    from specdraft.train.trainer import run_train

    export, run_dir = work / setting / "export", work / setting / "train"
    if (export / "config.json").is_file():
        return export
    recipe = load_recipe(recipe_path, [*overrides, f"target.quantization={setting}",
                                       f"distill.output_dir={work / setting / 'data'}", f"train.output_dir={run_dir}",
                                       f"train.max_steps={args.steps}", f"train.micro_batch_size={args.micro_batch}",
                                       f"train.val_every_steps={args.steps}", "train.resume=auto"])
    started = time.perf_counter()
    counts = run_distill(recipe)
    distilled = time.perf_counter()
    summary = run_train(recipe)
    export_draft(run_dir, "hf", export)
    write_report(work / setting / "head.json", {"counts": counts, "distill_s": distilled - started,
                                                "train_s": time.perf_counter() - distilled, "train": summary}, "head")
    return export


def bench_head(export: Path, quantization: str, intermediate: Optional[str], args, out: Path) -> dict:
    """`specdraft bench` of one head for the target at `quantization` (T=0, the default tree) -> its row."""
    from specdraft.config import RuntimeConfig
    from specdraft.runtime.bench import BenchSettings, run_bench
    from specdraft.runtime.load import build_runtime, load_parts

    cfg = RuntimeConfig(quantization=quantization, intermediate=intermediate, device=args.device, max_len=args.max_len)
    float32 = replace(cfg, dtype="float32")
    settings = BenchSettings(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, temperatures=(0.0,),
                             hf_baseline=False, lossless_prompts=args.lossless_prompts,
                             **({"prompts": args.prompts} if args.prompts else {}))
    report = run_bench(build_runtime(*load_parts(export, cfg), cfg), settings, out,
                       load_float32=lambda: build_runtime(*load_parts(export, float32), float32))
    run, check = report["runs"][0], report["float32_check"]
    return {"tau": run["tau"], "tokens_per_s": run["tokens_per_s"], "tokens_per_s_plain": run["tokens_per_s_plain"],
            "speedup_vs_plain": run["speedup_vs_plain"], "prompts": run["prompts"],
            "lossless_float32": None if check is None else f"{check['identical']}/{check['prompts']}",
            "cycle_ms": report["cycle_profile"]["cycle_ms"], "plain_step_ms": report["cycle_profile"]["plain_step_ms"]}


def heads_table(rows: List[dict]) -> str:
    return markdown_table(
        ["head trained on", "decoding for", "τ", "spec tok/s", "plain tok/s", "× plain", "cycle ms",
         "plain step ms", "float32 lossless"],
        [[r["head"], r["target"] + (" (hierarchical)" if r.get("intermediate") else ""), f"{r['tau']:.3f}",
          f"{r['tokens_per_s']:,.1f}", f"{r['tokens_per_s_plain']:,.1f}", f"{r['speedup_vs_plain']:.2f}",
          f"{r['cycle_ms']:.3f}", f"{r['plain_step_ms']:.3f}", r["lossless_float32"] or "-"] for r in rows])


def heads_args(argv) -> argparse.Namespace:
    parser = recipe_parser("heads trained on the full-precision and the int4 target, decoding for the int4 target",
                           "runs/bench/quantized_heads", 200)
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--prompts", default=None, help="bench prompts (default: MT-bench's questions)")
    parser.add_argument("--max-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--lossless-prompts", type=int, default=10)
    parser.add_argument("--max-len", type=int, default=2048, help="the runtime's cache slots (runtime.max_len)")
    parser.add_argument("--intermediate", default=None, help="a Kangaroo export of the target: one more row, "
                                                             "hierarchical drafting")
    parser.add_argument("--device", default="auto")
    return parser.parse_intermixed_args(argv)


def heads_main(argv=None) -> dict:
    args = heads_args(argv)
    work, out = Path(args.work), Path(args.out)
    exports = {setting: trained_head(args.recipe, setting, work, args, args.overrides) for setting in HEAD_SETTINGS}
    plan = [("none", "none", None), ("none", "int4", None), ("int4", "int4", None)]
    if args.intermediate:
        plan.append(("int4", "int4", args.intermediate))
    rows = []
    for head, target, intermediate in plan:
        name = f"{head}-head-{target}-target" + ("-hierarchical" if intermediate else "")
        row = bench_head(exports[head], target, intermediate, args, out / "heads" / name)
        rows.append({"head": head, "target": target, "intermediate": intermediate, **row})
        write_report(out, {"machine": machine(), "rows": rows}, "heads")
    heads = {setting: json.loads((work / setting / "head.json").read_text()) for setting in HEAD_SETTINGS
             if (work / setting / "head.json").is_file()}
    report = {"machine": machine(), "torch": torch.__version__, "recipe": args.recipe, "overrides": args.overrides,
              "steps": args.steps, "micro_batch": args.micro_batch, "heads": heads, "rows": rows}
    return finish(heads_table(rows), out, report, "heads")


def all_main(argv: List[str]) -> dict:
    """`decode`, then `heads` (the recipe and everything after it), each in its own process."""
    out = argv[argv.index("--out") + 1] if "--out" in argv else "runs/bench"
    results = {}
    for part, part_args in (("decode", ["--tokens", "128", "--out", out]), ("heads", argv)):
        code = subprocess.run([sys.executable, "-m", "tools.bench.quantization", part, *part_args],
                              env=child_env()).returncode
        results[part] = "ok" if code == 0 else f"failed (exit {code})"
    print(json.dumps(results))
    return results


def main(argv=None):
    return run_parts({"training": training_main, "decode": decode_main, "heads": heads_main, "all": all_main}, argv)


if __name__ == "__main__":
    main()
