#!/usr/bin/env bash
# The next session's GPU work, one function per machine kind (Session 8 was lent nvidia-h100-x1 and x2, no x4).
# Run it detached from a copy of the repository with tools/gpu/env.sh sourced (DEEPSPEED=1); .data/prev and
# .data/run2 (Session 8's second prompt set, distilled: no distillation needed) carried as tools/gpu/README says.
#   heads9 (one or two GPUs): the compiled-gradient GPU test; EAGLE-3 and PosS-1 side by side (one per GPU where
#          there are two) with the same data, $STEPS steps and seed, compiled when that test passes, each benched
#          on $MAX_PROMPTS MT-bench prompts (default 20); then the runtime bench of the EAGLE-3 head alone on the
#          GPU (issues 3 and 4), and both heads' acceptance plots. Session 10 found compiled heads slower than
#          planned (tools/gpu/README.md): at 1,000+ steps this no longer fits one machine's 30 minutes.
#   multi9 (2 or 4 GPUs): tests/test_multi_gpu.py (DDP with train.compile=true against compiled references, and
#          the four other cases), then bench_scale with ZeRO-2 and ZeRO-3 on the GPUs present, then ZeRO-3 on 1
#          and 2 GPUs under the profiler (--profile: each rank's op tables), to find its lost time (issue 7).
set -u
export STEPS=${STEPS:-1600} EXTRA_DATA=${EXTRA_DATA:-$PWD/.data/run2}
source tools/gpu/session7.sh  # (and session5/6.sh) stamp, pack, heads, wait_for_target, compiled_heads, runtime_bench

heads9() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "session9 heads start"
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_train_perf.py \
    > "$RESULTS/gpu_tests_compile.log" 2>&1
  export COMPILE=${COMPILE:-$(compiled_heads)}
  wait_for_target
  stamp "heads, train.compile=$COMPILE, $STEPS steps, extra data $EXTRA_DATA"
  local second=0
  [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && second=1  # each head on its own GPU where there are two
  ( heads 0 eagle3 ) & ( heads $second poss1 ) &
  wait
  runtime_bench
  for kind in chain tree; do
    python3 tools/plot_acceptance.py --out "$RESULTS/acceptance_$kind.png" \
      --title "MT-bench (${MAX_PROMPTS:-20} prompts), T=0, $kind" \
      "eagle3=$WORK/methods45/eagle3/bench_$kind/bench.json" "poss1=$WORK/methods45/poss1/bench_$kind/bench.json" \
      > "$RESULTS/acceptance_$kind.txt" 2>&1
  done
  collect; pack
  stamp "session9 heads done"
}

multi9() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  local count gpus=1,2
  count=$(nvidia-smi -L | wc -l)
  [ "$count" -ge 4 ] && gpus=1,2,4
  stamp "multi-gpu tests on $count GPUs"
  CUDA_VISIBLE_DEVICES=0,1 timeout 600 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py \
    > "$RESULTS/gpu_tests_multi.log" 2>&1
  stamp "multi-gpu tests: $(tail -1 "$RESULTS/gpu_tests_multi.log")"
  timeout 540 python3 tools/bench_scale.py --gpus "$gpus" --strategies deepspeed_stage_2,deepspeed_stage_3 \
    --warmup 3 --steps 6 --timeout 100 --out "$RESULTS/bench_scale" > "$RESULTS/bench_scale.log" 2>&1
  tail -10 "$RESULTS/bench_scale.log"
  pack
  timeout 400 python3 tools/bench_scale.py --gpus 1,2 --strategies deepspeed_stage_3 --warmup 3 --steps 4 --profile 2 \
    --timeout 150 --out "$RESULTS/bench_scale_zero3_profile" > "$RESULTS/bench_scale_zero3_profile.log" 2>&1
  cp "$RESULTS"/bench_scale_zero3_profile/work/runs/*/profile_train*.json "$RESULTS/bench_scale_zero3_profile/" 2>/dev/null
  pack
  stamp "session9 multi done"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-heads9}"; fi  # sourced: its functions only, status 0
