#!/usr/bin/env bash
# Every GPU measurement of docs/benchmarks.md for issues 3-7, on one 2-GPU machine, in two lanes that run at once
# (one per GPU) and then a stage that uses both GPUs. Results (JSON, PNG, logs) go to $RESULTS.
#   lane 0 (GPU 0): GPU tests; tools/bench_kernels.py; tools/bench_train.py; then, once the EAGLE-3 head of
#                   lane 1 is exported, `specdraft bench` on MT-bench (HF generate, plain and speculative).
#   lane 1 (GPU 1): tools/gpu/methods45.sh: EAGLE-3, PosS, Kangaroo heads on the same data, steps and seed.
#   both GPUs:      tests/test_multi_gpu.py, tools/bench_scale.py, tools/bench_distill_scale.py.
# Usage (after the two SmolLM2 calls of ../shared/gpu/README.md): DEEPSPEED=1 source tools/gpu/env.sh;
#   setsid nohup bash tools/gpu/session.sh > $HOME/session.log 2>&1 &
set -u
export RESULTS=${RESULTS:-$HOME/results} WORK=${WORK:-$HOME/work}
mkdir -p "$RESULTS" "$WORK"
stamp() { echo "=== $* $(date +%T)"; }

lane0() {
  export CUDA_VISIBLE_DEVICES=0
  stamp lane0 tests
  timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/test_multi_gpu.py > "$RESULTS/gpu_tests_runtime.log" 2>&1
  tail -n 3 "$RESULTS/gpu_tests_runtime.log"
  stamp lane0 bench_kernels
  timeout 300 python3 tools/bench_kernels.py --out "$RESULTS/bench_kernels.json" > "$RESULTS/bench_kernels.log" 2>&1
  stamp lane0 bench_train
  timeout 420 python3 tools/bench_train.py --out "$RESULTS/bench_train.json" > "$RESULTS/bench_train.log" 2>&1
  stamp lane0 waiting for the EAGLE-3 export
  while [ ! -f "$WORK/methods45/eagle3/export/model.safetensors" ]; do sleep 5; done
  sleep 5
  stamp lane0 runtime bench
  local args=(--temperature 0 1 --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts "${BENCH_PROMPTS:-10}"
              --max-new-tokens 256 --depth 6 --topk 8 --budget 48 --trace)
  python3 -m specdraft.cli bench "$WORK/methods45/eagle3/export" "${args[@]}" --out "$RESULTS/runtime_tree" \
    > "$RESULTS/runtime_tree.log" 2>&1 || python3 -m specdraft.cli bench "$WORK/methods45/eagle3/export" \
    "${args[@]}" --no-cuda-graphs --out "$RESULTS/runtime_tree_eager" > "$RESULTS/runtime_tree_eager.log" 2>&1
  python3 -m specdraft.cli bench "$WORK/methods45/eagle3/export" --temperature 0 --prompts "$PWD/.data/mt_bench.jsonl" \
    --max-prompts "${BENCH_PROMPTS:-10}" --max-new-tokens 256 --chain --depth 6 --no-hf --out "$RESULTS/runtime_chain" \
    > "$RESULTS/runtime_chain.log" 2>&1
  SPECDRAFT_KERNELS=reference python3 -m specdraft.cli bench "$WORK/methods45/eagle3/export" --temperature 0 \
    --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 5 --max-new-tokens 256 --depth 6 --topk 8 --budget 48 \
    --no-hf --out "$RESULTS/runtime_tree_reference_kernels" > "$RESULTS/runtime_tree_reference_kernels.log" 2>&1
  stamp lane0 done
}

lane1() {
  export CUDA_VISIBLE_DEVICES=1
  local done_runs=()
  for run in ${RUNS:-eagle3 poss2 kangaroo4 poss1 poss3 kangaroo2 kangaroo8}; do
    stamp lane1 "$run"
    if RUNS=$run STEPS=${STEPS:-800} MAX_PROMPTS=${METHOD_PROMPTS:-20} bash tools/gpu/methods45.sh \
        > "$RESULTS/methods45_$run.log" 2>&1; then done_runs+=("$run"); fi
    for kind in chain tree; do  # every finished run so far, on one plot (lane 1 may be stopped at any time)
      labels=()
      for name in "${done_runs[@]}"; do labels+=("$name=$WORK/methods45/$name/bench_$kind/bench.json"); done
      [ ${#labels[@]} -gt 0 ] && python3 tools/plot_acceptance.py --out "$RESULTS/acceptance_$kind.png" \
        --title "MT-bench, T=0, $kind" "${labels[@]}" > "$RESULTS/acceptance_$kind.txt" 2>&1
    done
  done
  stamp lane1 done
}

both() {
  export CUDA_VISIBLE_DEVICES=0,1
  stamp both multi-gpu tests
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py > "$RESULTS/gpu_tests_multi.log" 2>&1
  stamp both bench_scale
  timeout 300 python3 tools/bench_scale.py --gpus 1,2 --steps 8 --warmup 3 --out "$RESULTS/bench_scale" \
    > "$RESULTS/bench_scale.log" 2>&1
  stamp both bench_distill_scale
  timeout 180 python3 tools/bench_distill_scale.py --workers 1,2 --out "$RESULTS/bench_distill" -- \
    "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts2.jsonl]" data.max_samples=512 \
    distill.batch_size=256 distill.shard_size=64 distill.max_new_tokens=256 > "$RESULTS/bench_distill.log" 2>&1
  stamp both done
}

lane_cpu() {  # the CPU test suite on this machine's cores, while the GPUs work (a second opinion on the merge)
  CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=8 timeout 600 python3 -m pytest -q -p no:cacheprovider -m "not gpu and not slurm" \
    tests > "$RESULTS/cpu_tests.log" 2>&1
  stamp cpu tests done
}

lane_cpu &
lane0 & pid0=$!
lane1 & pid1=$!
wait $pid0
[ "${BOTH_AFTER_LANE0:-1}" = 1 ] && { kill $pid1 2>/dev/null; pkill -P $pid1 2>/dev/null; }
both
stamp session done
