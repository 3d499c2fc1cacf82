#!/usr/bin/env bash
# PosS-1/2/3 and the Kangaroo exit-layer sweep against an EAGLE-3 head on one GPU (issues 4 and 5), SmolLM2-135M-
# Instruct: every run trains on the same distilled data with the same steps, batch, schedule and seed, then is
# exported (hf) and evaluated on MT-bench at T=0 (chain of 6, lossless-checked). Needs an existing distilled set
# ($DATA: tools/gpu/foundation.sh's $WORK/data), .data/mt_bench.jsonl, the GGUF at $GGUF, tools/gpu/env.sh sourced.
# Usage: DATA=DIR [EXTRA=DIR] [RUNS="eagle3 poss1 poss2 poss3 kangaroo2 kangaroo4 kangaroo8"] [STEPS=600 MB=32]
#        [MAX_PROMPTS=80 EVAL_TOKENS=256 EVAL_PROMPTS=FILE PYTHON=python3] bash tools/gpu/methods45.sh [overrides]
# (the overrides apply to every run's training). Writes $WORK/methods45/<run>/{train,export,eval} and
# acceptance.png/.json (tools/plot_acceptance.py), and prints the τ table.
set -euo pipefail
work=${WORK:-$HOME/work}/methods45
gguf=${GGUF:-$HOME/smol/SmolLM2-135M-Instruct.Q4_1.gguf}
runs=${RUNS:-eagle3 poss1 poss2 poss3 kangaroo2 kangaroo4 kangaroo8}
common=("target.path=$gguf" data.val_fraction=0.02 "distill.output_dir=${DATA:?set DATA to the distilled set}"
        "train.extra_distilled=[${EXTRA:-}]" "eval.prompts=${EVAL_PROMPTS:-$PWD/.data/mt_bench.jsonl}"
        "eval.max_prompts=${MAX_PROMPTS:-null}" "eval.max_new_tokens=${EVAL_TOKENS:-256}" eval.num_draft_tokens=6)
train=("train.max_steps=${STEPS:-600}" "train.micro_batch_size=${MB:-32}" train.lr=5e-4 train.warmup_steps=60
       train.val_every_steps=200 train.log_every_steps=50 train.seed=0)
py=${PYTHON:-python3}
cli="$py -m specdraft.cli"

method_args() {  # run name -> recipe and method overrides
  case $1 in
    eagle3) echo "recipes/eagle3_smollm2.yaml" ;;
    poss1) echo "recipes/poss_smollm2.yaml method.positions_per_specialist=1 method.num_specialists=6" ;;
    poss2) echo "recipes/poss_smollm2.yaml method.positions_per_specialist=2 method.num_specialists=3" ;;
    poss3) echo "recipes/poss_smollm2.yaml method.positions_per_specialist=3 method.num_specialists=2" ;;
    kangaroo*) echo "recipes/kangaroo_smollm2.yaml method.exit_layer=${1#kangaroo}" ;;
    *) echo "unknown run $1" >&2; exit 2 ;;
  esac
}

for name in $runs; do
  spec=$(method_args "$name")
  read -r -a args <<< "$spec"
  echo "=== $name train $(date +%T)"
  $cli train "${args[@]}" "${common[@]}" "${train[@]}" "train.output_dir=$work/$name/train" "$@"
  $cli export "$work/$name/train" --format hf --out "$work/$name/export"
  echo "=== $name eval $(date +%T)"
  $cli eval "$work/$name/export" --out "$work/$name/eval" "${common[@]}"
done
labels=()
for name in $runs; do labels+=("$name=$work/$name/eval/eval.json"); done
$py tools/plot_acceptance.py --out "$work/acceptance.png" "${labels[@]}"
echo "=== done $(date +%T)"
