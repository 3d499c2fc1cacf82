#!/usr/bin/env bash
# Session 12's GPU work on one 4-GPU machine. Run it detached from a copy of the repository with tools/gpu/env.sh
# sourced (DEEPSPEED=1).
#   zero3x (no SmolLM2, no data; about 9 minutes): issue 7's ZeRO-3 slow rank. The host's topology; every GPU's
#          clocks and power twice a second throughout; ZeRO-3 on 1, 2, 4 GPUs with every rank's phases (wall, main-
#          thread CPU, preemptions), $STEPS3 timed steps; then on 1 and 4 with --blocking-sync (waiting hosts sleep),
#          with --pin-cores (each rank's threads on its own physical cores), and ZeRO-2 on 1 and 4 with phases.
#   heads12 (SmolLM2 and .data/prev, .data/run2 carried): EAGLE-3, PosS-1, PosS-2 and Kangaroo ℓ=2, one per GPU,
#          with Session 6's data, steps (STEPS, 1000), micro-batch and seed, and the recipes' draft vocabulary
#          (16,384 since Session 11), each benched on MAX_PROMPTS (80) MT-bench prompts; then the runtime bench of
#          the EAGLE-3 head (issues 3-5).
set -u
export STEPS=${STEPS:-1000} MAX_PROMPTS=${MAX_PROMPTS:-80} EXTRA_DATA=${EXTRA_DATA:-$PWD/.data/run2}
source tools/gpu/session7.sh  # (and session5/6.sh) stamp, pack, heads, wait_for_target, runtime_bench, collect

scale_runs() {  # $1 name, $2 strategies, $3 GPU counts, then extra bench_scale flags
  local name=$1 strategies=$2 gpus=$3; shift 3
  stamp "bench_scale $name"
  timeout 600 python3 tools/bench_scale.py --gpus "$gpus" --strategies "$strategies" --warmup 5 --steps "${STEPS3:-15}" \
    --phases --timeout 150 --out "$RESULTS/$name" "$@" > "$RESULTS/$name.log" 2>&1
  tail -6 "$RESULTS/$name.log"
  mkdir -p "$RESULTS/$name/phases"
  for run in "$RESULTS/$name"/work/runs/*/; do
    for file in "$run"profile_train*.json; do
      [ -f "$file" ] && cp "$file" "$RESULTS/$name/phases/$(basename "$run")_$(basename "$file")"
    done
  done
  pack
}

zero3x() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "session12 zero3x on $(nvidia-smi -L | wc -l) GPUs"
  { lscpu; echo; nvidia-smi topo -m; echo; nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; } > "$RESULTS/host.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv -lms 500 > "$RESULTS/gpu_clocks.csv" 2>&1 &
  local clocks=$!
  scale_runs zero3 deepspeed_stage_3 1,2,4
  scale_runs zero3_blocking deepspeed_stage_3 1,4 --blocking-sync
  scale_runs zero3_pinned deepspeed_stage_3 1,4 --pin-cores
  scale_runs zero2 deepspeed_stage_2 1,4
  kill "$clocks"
  pack
  stamp "session12 zero3x done"
}

heads12() {
  wait_for_target
  stamp "heads, $STEPS steps, extra data $EXTRA_DATA"
  ( heads 0 eagle3 ) & ( heads 1 poss1 ) & ( heads 2 poss2 ) & ( heads 3 kangaroo2 ) &
  wait
  collect; pack
  for kind in chain tree; do
    python3 tools/plot_acceptance.py --out "$RESULTS/acceptance_$kind.png" --title "MT-bench ($MAX_PROMPTS prompts), T=0, $kind" \
      eagle3="$WORK/methods45/eagle3/bench_$kind/bench.json" poss1="$WORK/methods45/poss1/bench_$kind/bench.json" \
      poss2="$WORK/methods45/poss2/bench_$kind/bench.json" kangaroo2="$WORK/methods45/kangaroo2/bench_$kind/bench.json" \
      > "$RESULTS/acceptance_$kind.txt" 2>&1
  done
  pack
  runtime_bench
  pack
  stamp "session12 heads done"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-zero3x}"; fi  # sourced: its functions only, status 0
