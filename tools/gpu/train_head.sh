#!/usr/bin/env bash
# Train one draft for SmolLM2 on the distilled data in $DATA (default .data/prev/data: run 1 of
# docs/benchmarks.md), with the settings every method's comparison shares, then export it (hf).
# The defaults are Session 14's best EAGLE-3 head (32 rows, lr 1e-3, 2,500 steps: docs/benchmarks.md).
# Usage: NAME=eagle3 RECIPE=recipes/eagle3_smollm2.yaml [STEPS=2500] bash tools/gpu/train_head.sh [overrides]
# Output: $WORK/$NAME/{train,export}. Needs tools/gpu/env.sh sourced.
set -euo pipefail
work=${WORK:-$HOME/work}/$NAME
python3 -m specdraft.cli train "$RECIPE" "target.path=$GGUF" "distill.output_dir=${DATA:-$PWD/.data/prev/data}" \
  "train.output_dir=$work/train" "train.max_steps=${STEPS:-2500}" train.micro_batch_size=32 train.lr=1e-3 \
  train.warmup_steps=100 train.val_every_steps=250 train.log_every_steps=50 train.seed=0 \
  data.max_length=1024 data.val_fraction=0.02 "$@"
python3 -m specdraft.cli export "$work/train" --format hf --out "$work/export"
echo "=== $NAME trained and exported to $work/export"
