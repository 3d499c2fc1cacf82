#!/usr/bin/env bash
# Session 10's GPU work. Run it detached from a copy of the repository with tools/gpu/env.sh sourced (DEEPSPEED=1),
# with .data/prev and .data/mt_bench.jsonl carried (tools/gpu/README.md).
#   train10 (one GPU, no SmolLM2): issue 6's step before and after this session's changes (the target forward
#           without its all-ones mask, so without the host's read of it; the TTT merge compiled), in one run on one
#           GPU: bench_train of the previous tree ($OLD_TREE: `git archive 2cae778 specdraft tools data_gen`
#           unpacked) and of this one, 2048 tokens with op profiles, then 8192; then the GPU tests of the parts
#           that changed.
#   heads10 (one or two GPUs, SmolLM2; .data/run2 carried): EAGLE-3 and PosS-1 side by side (on two GPUs, one
#           each), same data, $STEPS steps and seed, benched on all 80 MT-bench prompts (issue 4), and their
#           acceptance plots.
set -u
export STEPS=${STEPS:-1000} EXTRA_DATA=${EXTRA_DATA:-$PWD/.data/run2}
source tools/gpu/session7.sh  # (and session5/6.sh) stamp, pack, heads, wait_for_target, compiled_heads, collect

bench_rows() {  # $1 tree, $2 output name, $3.. bench_train arguments
  local tree=$1 name=$2; shift 2
  ( cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout 420 python3 tools/bench_train.py "$@" \
      --out "$RESULTS/$name.json" ) > "$RESULTS/$name.log" 2>&1
  stamp "$name: $(grep -c ' ok ' "$RESULTS/$name.log") rows ok"
}

train10() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "session10 train start"
  local profiled=(--seq-lens 2048 --warmup 3 --steps 8 --profile 2)
  bench_rows "${OLD_TREE:?}" bench_train_2048_before "${profiled[@]}" --rows ours-swiglu-8bit-fused
  bench_rows "$PWD" bench_train_2048 "${profiled[@]}" --rows baseline ours-swiglu ours-swiglu-8bit-fused
  bench_rows "$PWD" bench_train_8192 --seq-lens 8192 --warmup 2 --steps 4 --rows ours-swiglu-8bit-fused
  pack
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_train_perf.py \
    tests/kernels/test_ttt_attention.py tests/test_packing.py tests/test_bench_train.py \
    > "$RESULTS/gpu_tests.log" 2>&1
  stamp "gpu tests: $(tail -1 "$RESULTS/gpu_tests.log")"
  pack
  stamp "session10 train done"
}

heads10() {
  rm -rf "$RESULTS/methods"; mkdir -p "$RESULTS"
  export COMPILE=${COMPILE:-$(grep -qs "failed\|error" "$RESULTS/gpu_tests.log" && echo false || echo true)}
  wait_for_target
  stamp "heads, train.compile=$COMPILE, $STEPS steps, extra data $EXTRA_DATA"
  export MAX_PROMPTS=80
  local second=0
  [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && second=1  # each head on its own GPU where there are two
  ( heads 0 eagle3 ) & ( heads $second poss1 ) &
  wait
  for kind in chain tree; do
    python3 tools/plot_acceptance.py --out "$RESULTS/acceptance_$kind.png" --title "MT-bench (80), T=0, $kind" \
      "eagle3=$WORK/methods45/eagle3/bench_$kind/bench.json" "poss1=$WORK/methods45/poss1/bench_$kind/bench.json" \
      > "$RESULTS/acceptance_$kind.txt" 2>&1
  done
  collect; pack
  stamp "session10 heads done"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-train10}"; fi  # sourced: its functions only, status 0
