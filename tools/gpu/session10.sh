#!/usr/bin/env bash
# Session 10's GPU work. Run it detached from a copy of the repository with tools/gpu/env.sh sourced (DEEPSPEED=1),
# with .data/prev and .data/mt_bench.jsonl carried (tools/gpu/README.md).
#   train10 (one GPU, no SmolLM2): issue 6's step before and after this session's changes (the target forward
#           without its all-ones mask, so without the host's read of it; the TTT merge compiled), in one run on one
#           GPU: bench_train of the previous tree ($OLD_TREE: `git archive 2cae778 specdraft tools data_gen`
#           unpacked) and of this one, 2048 tokens with op profiles, then 8192; then the GPU tests of the parts
#           that changed.
#   The heads for issues 3 and 4 are session9.sh's heads9 (MAX_PROMPTS=80 for all of MT-bench); Session 10
#   stopped them at step 150 (docs/benchmarks.md).
set -u
source tools/gpu/session7.sh  # (and session5/6.sh) stamp, pack

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

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-train10}"; fi  # sourced: its functions only, status 0
