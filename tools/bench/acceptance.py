"""Foundation benchmark: distill tokens/s, train tokens/s, held-out simulated τ and evaluated τ of one recipe.

Runs distill-data -> train -> export -> eval into WORK (or, with --collect, only reads a WORK that
tools/gpu/foundation.sh filled), prints a table and writes WORK/bench.json.

    python tools/bench_foundation.py recipes/smoke/eagle3_smollm2.yaml --work runs/bench_cpu
    python tools/bench_foundation.py --collect --work $HOME/work            # after tools/gpu/foundation.sh
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch

from specdraft.io import write_json


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"


def run_stages(recipe: str, work: Path, overrides: list) -> None:
    from specdraft import cli

    common = [f"distill.output_dir={work / 'data'}", f"train.output_dir={work / 'train'}", *overrides]
    for argv in (["distill-data", recipe, *common], ["train", recipe, *common],
                 ["export", str(work / "train"), "--format", "hf", "--out", str(work / "export")],
                 ["eval", str(work / "export"), *overrides]):
        if cli.main(argv) != 0:
            raise SystemExit(f"stage failed: specdraft {' '.join(argv)}")


def collect(work: Path) -> dict:
    distill, counts = _read(work / "data" / "throughput.json"), _read(work / "data" / "counts.json")
    train, best = _read(work / "train" / "train_summary.json"), _read(work / "train" / "best" / "meta.json")
    evaluation = _read(work / "export" / "eval.json")
    return {
        "machine": _machine(), "torch": torch.__version__,
        "distill_conversations": counts.get("ok"), "distill_tokens_per_s": distill.get("tokens_per_s"),
        "train_steps": train.get("steps"), "train_tokens_per_s": train.get("tokens_per_s"),
        "val_tau_sim_best": best.get("metrics", {}).get("val/tau_sim"), "best_step": best.get("step"),
        "eval_tau": evaluation.get("tau"), "eval_lossless": evaluation.get("lossless"),
        "eval_prompts": evaluation.get("prompts"),
        "acceptance_by_position": evaluation.get("acceptance_by_position"),
    }


def print_table(result: dict) -> None:
    width = max(len(k) for k in result)
    for key, value in result.items():
        shown = f"{value:.3f}" if isinstance(value, float) else \
            "[" + " ".join(f"{v:.2f}" for v in value) + "]" if isinstance(value, list) else value
        print(f"{key:<{width}}  {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", nargs="?", default="recipes/smoke/eagle3_smollm2.yaml")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--work", default="runs/bench_foundation")
    parser.add_argument("--collect", action="store_true", help="only read an existing WORK")
    args = parser.parse_args()
    work = Path(args.work)
    if not args.collect:
        run_stages(args.recipe, work, args.overrides)
    result = collect(work)
    print_table(result)
    write_json(work / "bench.json", result)


if __name__ == "__main__":
    main()
