#!/usr/bin/env bash
# Session 11's GPU work (issue 7), on one 4-GPU machine. Run it detached from a copy of the repository with
# tools/gpu/env.sh sourced (DEEPSPEED=1); it needs no SmolLM2 and no data.
#   multi11: first, side by side, ZeRO-3 on 1 and 2 GPUs under the profiler with Chrome traces (GPUs 0-1) and the
#            compiled DDP case of tests/test_multi_gpu.py (GPUs 2-3); then ZeRO-2 and ZeRO-3 scaling on 1, 2 and 4
#            GPUs, alone on the machine.
#   persist11: ZeRO-3 with train.deepspeed making the draft's weights persistent, on 1, 2 and 4 GPUs, then ZeRO-3 as
#            it is on 1 and 4, both with every rank's phase times (bench_scale --phases).
#   zero3: ZeRO-3 scaling on 1, 2 and 4 GPUs with every rank's phases (wall and main-thread CPU ms, preemptions),
#            into $RESULTS/bench_scale_${TAG:-after}; then on 1 and 4 with --blocking-sync (waiting hosts sleep
#            instead of spinning), into ..._blocking. About 6 minutes.
set -u
source tools/gpu/session7.sh  # (and session5/6.sh) stamp, pack

profile_zero3() {
  CUDA_VISIBLE_DEVICES=0,1 timeout 420 python3 tools/bench_scale.py --gpus 1,2 --strategies deepspeed_stage_3 \
    --warmup 3 --steps 4 --profile 2 --trace --timeout 200 --out "$WORK/zero3_profile" \
    > "$RESULTS/zero3_profile.log" 2>&1
  mkdir -p "$RESULTS/zero3_profile"
  cp "$WORK"/zero3_profile/bench_scale.json "$RESULTS/zero3_profile/" 2>/dev/null
  for run in "$WORK"/zero3_profile/work/runs/*/; do
    local name; name=$(basename "$run")
    for file in "$run"profile_train*.json; do [ -f "$file" ] && cp "$file" "$RESULTS/zero3_profile/${name}_$(basename "$file")"; done
    for file in "$run"trace*.json; do [ -f "$file" ] && gzip -c "$file" > "$RESULTS/zero3_profile/${name}_$(basename "$file").gz"; done
  done
  cp "$WORK"/zero3_profile/logs/*.log "$RESULTS/zero3_profile/" 2>/dev/null
}

multi11() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "session11 multi start on $(nvidia-smi -L | wc -l) GPUs"
  profile_zero3 &
  CUDA_VISIBLE_DEVICES=2,3 timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py -k "ddp-False-true" \
    > "$RESULTS/gpu_tests_multi_compile.log" 2>&1
  stamp "compiled ddp test: $(tail -1 "$RESULTS/gpu_tests_multi_compile.log")"
  wait
  stamp "zero3 profile done"
  pack
  timeout 600 python3 tools/bench_scale.py --gpus 1,2,4 --strategies deepspeed_stage_2,deepspeed_stage_3 \
    --warmup 3 --steps 6 --timeout 110 --out "$RESULTS/bench_scale" > "$RESULTS/bench_scale.log" 2>&1
  tail -8 "$RESULTS/bench_scale.log"
  pack
  stamp "session11 multi done"
}

zero3() {
  local tag=${TAG:-after}
  stamp "zero3 $tag"
  timeout 560 python3 tools/bench_scale.py --gpus 1,2,4 --strategies deepspeed_stage_3 --warmup 3 --steps 6 --phases \
    --timeout 150 --out "$RESULTS/bench_scale_$tag" > "$RESULTS/bench_scale_$tag.log" 2>&1
  tail -6 "$RESULTS/bench_scale_$tag.log"
  pack
  timeout 400 python3 tools/bench_scale.py --gpus 1,4 --strategies deepspeed_stage_3 --warmup 3 --steps 6 --phases \
    --blocking-sync --timeout 150 --out "$RESULTS/bench_scale_${tag}_blocking" > "$RESULTS/bench_scale_${tag}_blocking.log" 2>&1
  tail -5 "$RESULTS/bench_scale_${tag}_blocking.log"
  pack
  stamp "zero3 $tag done"
}

persist11() {  # ZeRO-3 with the draft's weights persistent (never partitioned) on 1, 2, 4 GPUs, then as it is on 1, 4
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "persist11"
  timeout 560 python3 tools/bench_scale.py --gpus 1,2,4 --strategies deepspeed_stage_3 --warmup 3 --steps 6 --phases \
    --override train.deepspeed.zero_optimization.stage3_param_persistence_threshold=1000000000000 \
    --timeout 150 --out "$RESULTS/z3_persist" > "$RESULTS/z3_persist.log" 2>&1
  tail -6 "$RESULTS/z3_persist.log"
  pack
  timeout 400 python3 tools/bench_scale.py --gpus 1,4 --strategies deepspeed_stage_3 --warmup 3 --steps 6 --phases \
    --timeout 150 --out "$RESULTS/z3_default" > "$RESULTS/z3_default.log" 2>&1
  tail -5 "$RESULTS/z3_default.log"
  pack
  stamp "persist11 done"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-multi11}"; fi  # sourced: its functions only, status 0
