#!/usr/bin/env bash
# Session 6's GPU measurements on one 4-GPU machine (docs/benchmarks.md, "Session 6"), as one orchestrator.
# Run it detached from a copy of the repository, with tools/gpu/env.sh sourced (DEEPSPEED=1) and bitsandbytes
# installed; SmolLM2's GGUF may still be on its way ($GGUF): the stages that need it wait for it.
#   1 checks (no SmolLM2):  GPUs 0,1 tests/test_multi_gpu.py; GPU 2 the compiled-gradient test, then every other
#                           GPU test; GPU 3 bench_train (issue 6: rows at 2048 and 8192, profiled).
#   2 scaling:              bench_scale with ZeRO-3 on 1, 2 and 4 GPUs (issue 7).
#   3 data:                 the second prompt set distilled on 4 GPUs, beside run 1's conversations.
#   4 heads:                EAGLE-3, PosS-1/2/3 and Kangaroo ℓ 2/4 trained with the same data, steps and seed,
#                           compiled when stage 1's compiled-gradient test passed (all of them, or none), each
#                           benched on MT-bench; the runtime bench of the EAGLE-3 head; the Kangaroo ℓ × η sweep.
# Results go to $RESULTS and are packed into $HOME/results.tgz after every stage.
set -u
source tools/gpu/session5.sh  # its stages: pack, heads, data_stage, runtime_bench, kangaroo_sweep, collect
export STEPS=${STEPS:-1000}

# What stage 1 runs; session7.sh sets other rows and longer limits.
BENCH_ROWS=${BENCH_ROWS:-baseline ours-no-ckpt ours-swiglu ours-selective ours-swiglu-8bit ours-8bit}
MULTI_TIMEOUT=${MULTI_TIMEOUT:-420} REST_TIMEOUT=${REST_TIMEOUT:-300} BENCH_TIMEOUT=${BENCH_TIMEOUT:-330}

checks() {
  stamp "1 checks"
  ( CUDA_VISIBLE_DEVICES=0,1 timeout "$MULTI_TIMEOUT" python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py \
      > "$RESULTS/gpu_tests_multi.log" 2>&1; stamp "multi-gpu tests: $(tail -1 "$RESULTS/gpu_tests_multi.log")" ) &
  ( export CUDA_VISIBLE_DEVICES=2
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_train_perf.py \
      > "$RESULTS/gpu_tests_compile.log" 2>&1; stamp "compile test: $(tail -1 "$RESULTS/gpu_tests_compile.log")"
    timeout "$REST_TIMEOUT" python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/test_train_perf.py \
      --ignore tests/test_multi_gpu.py > "$RESULTS/gpu_tests_rest.log" 2>&1
    stamp "other gpu tests: $(tail -1 "$RESULTS/gpu_tests_rest.log")" ) &
  ( export CUDA_VISIBLE_DEVICES=3
    timeout "$BENCH_TIMEOUT" python3 tools/bench_train.py --seq-lens 2048 --warmup 3 --steps 6 --profile 2 \
      --rows $BENCH_ROWS --out "$RESULTS/bench_train_2048.json" > "$RESULTS/bench_train_2048.log" 2>&1
    timeout 200 python3 tools/bench_train.py --seq-lens 8192 --warmup 2 --steps 4 --rows ours-8bit ours-swiglu-8bit \
      --out "$RESULTS/bench_train_8192.json" > "$RESULTS/bench_train_8192.log" 2>&1
    stamp "bench_train done" ) &
  wait
  pack
}

scaling() {
  stamp "2 bench_scale zero3"
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 330 python3 tools/bench_scale.py --gpus 1,2,4 --strategies deepspeed_stage_3 \
    --warmup 3 --steps 6 --timeout 100 --out "$RESULTS/bench_scale_zero3" > "$RESULTS/bench_scale_zero3.log" 2>&1
  tail -8 "$RESULTS/bench_scale_zero3.log"
  pack
}

wait_for_target() {  # the GGUF is joined by a later device call, written under a temporary name and renamed
  local waited=0
  while [ ! -f "$GGUF" ] && [ $waited -lt 600 ]; do sleep 5; waited=$((waited + 5)); done
  stamp "target: $(ls -la "$GGUF" 2>&1)"
}

compiled_heads() {  # true when stage 1's compiled-gradient test passed
  grep -q " passed" "$RESULTS/gpu_tests_compile.log" && ! grep -q "failed\|error" "$RESULTS/gpu_tests_compile.log" \
    && echo true || echo false
}

run_session() {  # $1 name, $2 the scaling stage, $3 lane 3's runs: the stages every 4-GPU session runs
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "$1 start"
  checks
  "$2"
  wait_for_target
  data_stage; pack
  export COMPILE=${COMPILE:-$(compiled_heads)}
  stamp "4 heads, train.compile=$COMPILE, $STEPS steps"
  ( heads 0 eagle3; runtime_bench; touch "$WORK/lane0.done" ) &
  ( heads 1 poss1; touch "$WORK/lane1.done" ) &
  ( heads 2 poss2; touch "$WORK/lane2.done" ) &
  ( "$3"; touch "$WORK/lane3.done" ) &
  wait
  collect; pack
  stamp "$1 done"
}

lane3_session6() { heads 3 kangaroo2 & heads 3 kangaroo4; wait; kangaroo_sweep; heads 3 poss3; }

all() { run_session session6 scaling lane3_session6; }

[ "${BASH_SOURCE[0]}" = "$0" ] && "${1:-all}"  # sourced (session7.sh): its functions only
