#!/usr/bin/env bash
# Session 13's GPU work, on one 4-GPU machine, with tools/gpu/env.sh sourced (DEEPSPEED=1); SmolLM2 joined ($GGUF)
# and .data carried as tools/gpu/README.md says (prev, run2, train_prompts*.jsonl, mt_bench.jsonl) for the heads.
#   zero3why (no SmolLM2, no data, .whl with py-spy carried; about 6 minutes): what ZeRO-3's slow forwards do
#          (issue 7). ZeRO-3 on 1 and 4 GPUs, 30 timed steps with every rank's phases, now with the time inside CUDA
#          synchronizations and the caching allocator's cudaMalloc/cudaFree calls and retries; then one 1-GPU run of
#          200 timed steps sampled by py-spy: 15 s of Python stacks as a Chrome trace (to align with its step
#          times), then 10 s with native frames (collapsed stacks).
#   more13 (about 18 minutes): whether more of the target's own answers raise τ (issue 3's lever) and what the
#          draft vocabulary is worth. The 11.3k training prompts answered again at T=0.8 (seed 1) on 4 GPUs; then
#          four heads of STEPS (1000) steps with Session 6's seed and micro-batch, one per GPU: EAGLE-3 on the
#          greedy answers (Session 12's head again), the same at 8,192 draft tokens, EAGLE-3 on the greedy plus
#          the sampled answers, and PosS-1 on those; each benched on the same MAX_PROMPTS (80) MT-bench prompts.
#   vocab13 (about 12 minutes): EAGLE-3 and PosS-1 at 8,192 and at 16,384 draft tokens on Session 6's data.
#   all13: zero3why, then more13.
set -u
source tools/gpu/session12.sh  # (and session5/6/7.sh) stamp, pack, wait_for_target, collect

head_on() {  # GPU $1, label $2, run $3 (methods45.sh's names), then overrides: one head, trained and benched
  local gpu=$1 label=$2 run=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu WORK=$HOME/work_$label RUNS=$run bash tools/gpu/methods45.sh train.micro_batch_size=64 \
    train.val_every_steps=400 train.compile=false "$@" > "$RESULTS/head_$label.log" 2>&1
  local dir=$HOME/work_$label/methods45/$run
  mkdir -p "$RESULTS/heads/$label"
  cp "$dir/params.json" "$dir/train/train_summary.json" "$RESULTS/heads/$label/" 2>/dev/null
  cp "$dir"/train/logs/version_*/metrics.csv "$RESULTS/heads/$label/" 2>/dev/null
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

zero3why() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "session13 zero3why on $(nvidia-smi -L | wc -l) GPUs"
  STEPS3=30 scale_runs zero3 deepspeed_stage_3 1,4
  STEPS3=200 scale_runs zero3_sampled deepspeed_stage_3 1 &
  local run=$! pid=""
  for _ in $(seq 90); do
    sleep 2
    pid=$(pgrep -f "[p]rofile_train.py" | head -1)
    [ -n "$pid" ] && [ -f "$RESULTS/zero3_sampled/work/runs/deepspeed_stage_3-1/train/logs/step_times.csv" ] && break
  done
  sleep 3
  date +%s.%N > "$RESULTS/zero3_sampled_pyspy_start.txt"  # the trace's ts 0, to align with step_started_unix_each
  if [ -n "$pid" ]; then
    timeout 40 /tmp/site/bin/py-spy record -p "$pid" -d 15 -r 100 --nonblocking -f chrometrace \
      -o "$RESULTS/zero3_sampled_pyspy.json" > "$RESULTS/zero3_sampled_pyspy.log" 2>&1
    timeout 40 /tmp/site/bin/py-spy record -p "$pid" -d 10 -r 100 --native -f raw \
      -o "$RESULTS/zero3_sampled_pyspy_native.txt" >> "$RESULTS/zero3_sampled_pyspy.log" 2>&1
  fi
  wait "$run"
  pack
  stamp "session13 zero3why done"
}

more13() {
  export STEPS=${MORE_STEPS:-1000}
  mkdir -p "$RESULTS"
  wait_for_target
  stamp "sampled answers at T=0.8"
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 900 python3 tools/bench_distill_scale.py --workers 4 --out "$WORK/sampled" -- \
    "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts.jsonl,$PWD/.data/train_prompts2.jsonl]" \
    distill.batch_size=256 distill.shard_size=256 distill.max_new_tokens=256 distill.temperature=0.8 distill.seed=1 \
    > "$RESULTS/distill_sampled.log" 2>&1
  cp "$WORK/sampled/workers-4/counts.json" "$RESULTS/sampled_counts.json" 2>/dev/null
  pack
  stamp "heads: $STEPS steps"
  local greedy="train.extra_distilled=[$EXTRA_DATA]" both="train.extra_distilled=[$EXTRA_DATA,$WORK/sampled/workers-4]"
  local v16k=method.draft_vocab_size=16384  # the recipes' vocabulary when this ran (8,192 since)
  head_on 0 greedy eagle3 "$greedy" "$v16k" &
  head_on 1 greedy_v8k eagle3 "$greedy" method.draft_vocab_size=8192 &
  head_on 2 greedy_sampled eagle3 "$both" "$v16k" &
  head_on 3 poss1_greedy_sampled poss1 "$both" "$v16k" &
  wait
  plot_heads greedy greedy_v8k greedy_sampled poss1_greedy_sampled
  pack
  stamp "more13 done"
}

all13() {
  zero3why
  more13
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all13}"; fi  # sourced: its functions only, status 0
