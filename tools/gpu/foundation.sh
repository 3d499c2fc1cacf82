#!/usr/bin/env bash
# The foundation benchmark on one GPU (docs/benchmarks.md): distill a prompt mix of tools/prepare_prompts.py
# with SmolLM2-135M-Instruct, train the EAGLE-3 head, export it, evaluate on MT-bench at T=0 (chain of 6).
# Needs: .data/ (tools/prepare_prompts.py), the GGUF at $GGUF, tools/gpu/env.sh sourced.
# Usage: [PROMPTS=.data/x.jsonl EXTRA=DIR MAX_SAMPLES=N MAX_PROMPTS=N] bash tools/gpu/foundation.sh [train overrides]
set -euo pipefail
work=${WORK:-$HOME/work}
gguf=${GGUF:-$HOME/smol/SmolLM2-135M-Instruct.Q4_1.gguf}
prompts=${PROMPTS:-$PWD/.data/train_prompts.jsonl}
recipe=recipes/eagle3_smollm2.yaml
common=("target.path=$gguf" "data.prompts=[$prompts]" "data.max_samples=${MAX_SAMPLES:-null}"
        data.max_length=1024 data.too_long=skip data.val_fraction=0.02
        "distill.output_dir=$work/data" "train.output_dir=$work/train" "train.extra_distilled=[${EXTRA:-}]"
        "eval.prompts=$PWD/.data/mt_bench.jsonl" "eval.max_prompts=${MAX_PROMPTS:-null}" eval.max_new_tokens=256
        eval.num_draft_tokens=6)
cli="python3 -m specdraft.cli"
stage() { echo "=== $1 $(date +%T)"; }
stage distill
$cli distill-data $recipe "${common[@]}" distill.batch_size=${DISTILL_BATCH:-256} distill.shard_size=950 \
  distill.max_new_tokens=256
stage train
$cli train $recipe "${common[@]}" train.max_steps=3000 train.micro_batch_size=16 train.val_every_steps=250 \
  train.lr=3e-4 train.warmup_steps=100 train.log_every_steps=50 "$@"
stage export
$cli export "$work/train" --format hf --out "$work/export"
stage eval
$cli eval "$work/export" "${common[@]}"
stage done
