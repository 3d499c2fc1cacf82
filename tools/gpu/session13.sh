#!/usr/bin/env bash
# Ready for the next session, on one 4-GPU machine, with tools/gpu/env.sh sourced (DEEPSPEED=1), SmolLM2 joined
# ($GGUF) and .data carried as tools/gpu/README.md says (prev, run2, train_prompts*.jsonl, mt_bench.jsonl).
# Issue 7's next run is `session12.sh zero3why` (about 9 minutes, no SmolLM2).
#   vocab13 (about 12 minutes): what the draft vocabulary is worth in τ, and whether PosS-1's Session 6 gain
#          returns with the old vocabulary: EAGLE-3 and PosS-1 at 8,192 and at 16,384, one head per GPU, with
#          Session 6's data, steps and seed, all benched on the same MAX_PROMPTS (80) MT-bench prompts.
#   more13 (about 22 minutes): whether more of the target's own answers raise τ (issue 3's lever). The 11.3k
#          training prompts answered again at T=0.8 (seed 1) on 4 GPUs; then two EAGLE-3 heads of STEPS (2000)
#          steps side by side: the greedy answers alone (GPU 0), and the greedy plus the sampled ones (GPU 1).
set -u
source tools/gpu/session12.sh  # (and session5/6/7.sh) stamp, pack, wait_for_target, collect

head_on() {  # GPU $1, label $2, run $3 (methods45.sh's names), then overrides: one head, trained and benched
  local gpu=$1 label=$2 run=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu WORK=$HOME/work_$label RUNS=$run bash tools/gpu/methods45.sh train.micro_batch_size=64 \
    train.val_every_steps=400 train.compile=false "$@" > "$RESULTS/head_$label.log" 2>&1
  local dir=$HOME/work_$label/methods45/$run
  mkdir -p "$RESULTS/heads/$label"
  cp "$dir/params.json" "$dir/train/train_summary.json" "$RESULTS/heads/$label/" 2>/dev/null
  for kind in chain tree; do cp "$dir/bench_$kind/bench.json" "$RESULTS/heads/$label/bench_$kind.json" 2>/dev/null; done
  stamp "head $label done"
}

plot_heads() {  # labels: each one's chain and tree acceptance on one plot per kind
  for kind in chain tree; do
    local labels=()
    for label in "$@"; do labels+=("$label=$RESULTS/heads/$label/bench_$kind.json"); done
    python3 tools/plot_acceptance.py --out "$RESULTS/acceptance_$kind.png" \
      --title "MT-bench ($MAX_PROMPTS prompts), T=0, $kind" "${labels[@]}" > "$RESULTS/acceptance_$kind.txt" 2>&1
  done
}

vocab13() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  wait_for_target
  local data="train.extra_distilled=[$EXTRA_DATA]"
  stamp "vocab13: $STEPS steps, extra data $EXTRA_DATA"
  head_on 0 eagle3_v8k eagle3 "$data" method.draft_vocab_size=8192 &
  head_on 1 eagle3_v16k eagle3 "$data" method.draft_vocab_size=16384 &
  head_on 2 poss1_v8k poss1 "$data" method.draft_vocab_size=8192 &
  head_on 3 poss1_v16k poss1 "$data" method.draft_vocab_size=16384 &
  wait
  plot_heads eagle3_v8k eagle3_v16k poss1_v8k poss1_v16k
  pack
  stamp "vocab13 done"
}

more13() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  export STEPS=${MORE_STEPS:-2000}
  wait_for_target
  stamp "sampled answers at T=0.8"
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 900 python3 tools/bench_distill_scale.py --workers 4 --out "$WORK/sampled" -- \
    "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts.jsonl,$PWD/.data/train_prompts2.jsonl]" \
    distill.batch_size=256 distill.shard_size=256 distill.max_new_tokens=256 distill.temperature=0.8 distill.seed=1 \
    > "$RESULTS/distill_sampled.log" 2>&1
  cp "$WORK/sampled/workers-4/counts.json" "$RESULTS/sampled_counts.json" 2>/dev/null
  pack
  stamp "heads: $STEPS steps"
  head_on 0 greedy eagle3 "train.extra_distilled=[$EXTRA_DATA]" &
  head_on 1 greedy_sampled eagle3 "train.extra_distilled=[$EXTRA_DATA,$WORK/sampled/workers-4]" &
  wait
  plot_heads greedy greedy_sampled
  pack
  stamp "more13 done"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-vocab13}"; fi  # sourced: its functions only, status 0
