#!/usr/bin/env bash
# Every GPU measurement of docs/benchmarks.md ("Session 4") on one 4-GPU machine: four lanes at once (one per
# GPU), then a stage that uses all GPUs. Results (JSON, PNG, logs) go to $RESULTS.
#   data (all GPUs): 4 distill-data workers regenerate .data/train_prompts2.jsonl (7,500 prompts); with run 1's
#                   3,775 conversations (.data/prev/data, train.extra_distilled) that is every method's training set.
#   lane 0 (GPU 0): GPU tests while the EAGLE-3 head trains; then `specdraft bench` on MT-bench (HF generate,
#                   plain and speculative, tree and chain, T=0 and T=1; an fp32 lossless run); tools/bench_kernels.py.
#   lanes 1-3:      two method runs per GPU at once (tools/gpu/methods45.sh: same data, steps, seed as EAGLE-3):
#                   PosS-1/2/3 and Kangaroo at several exit layers; then tools/bench_kangaroo.py's η sweep.
#   GPUs 2, 3:      tests/test_multi_gpu.py beside the lanes (correctness only).
#   all GPUs:       tools/bench_distill_scale.py (1, 2, 4 workers), tools/bench_scale.py (1, 2, 4 GPUs, ZeRO-2/3).
# Usage (after the two SmolLM2 calls of ../shared/gpu/README.md): DEEPSPEED=1 source tools/gpu/env.sh;
#   setsid nohup bash tools/gpu/session4.sh > $HOME/session.log 2>&1 &
# `session4.sh runtime` (one GPU): the GPU runtime tests, an EAGLE-3 head on run 1's data, the runtime bench.
set -u
export RESULTS=${RESULTS:-$HOME/results} WORK=${WORK:-$HOME/work} STEPS=${STEPS:-1000}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$RESULTS" "$WORK"
stamp() { echo "=== $* $(date +%T)"; }
mt_bench=(--prompts "$PWD/.data/mt_bench.jsonl" --max-prompts "${BENCH_PROMPTS:-10}" --max-new-tokens 256)

extra_data() {  # the train override that adds the data stage's conversations, if it produced them
  [ -n "${EXTRA_DATA:-}" ] && echo "train.extra_distilled=[$EXTRA_DATA]"
}

runtime_bench() {  # the EAGLE-3 export on MT-bench: the issue-3 measurements
  local export_dir=$WORK/methods45/eagle3/export tree=(--depth 6 --topk 8 --budget 48)
  python3 -m specdraft.cli bench "$export_dir" --temperature 0 1 "${mt_bench[@]}" "${tree[@]}" --trace \
    --out "$RESULTS/runtime_tree" > "$RESULTS/runtime_tree.log" 2>&1
  python3 -m specdraft.cli bench "$export_dir" --temperature 0 "${mt_bench[@]}" --chain --depth 6 --no-hf \
    --out "$RESULTS/runtime_chain" > "$RESULTS/runtime_chain.log" 2>&1
  [ "${QUICK:-0}" = 1 ] && return
  python3 -m specdraft.cli bench "$export_dir" --temperature 0 "${mt_bench[@]}" "${tree[@]}" --no-hf --dtype float32 \
    --out "$RESULTS/runtime_tree_fp32" > "$RESULTS/runtime_tree_fp32.log" 2>&1
  SPECDRAFT_KERNELS=reference python3 -m specdraft.cli bench "$export_dir" --temperature 0 "${mt_bench[@]}" \
    "${tree[@]}" --no-hf --out "$RESULTS/runtime_tree_reference_kernels" > "$RESULTS/runtime_reference.log" 2>&1
}

lane0() {
  export CUDA_VISIBLE_DEVICES=0
  ( timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/test_multi_gpu.py \
      > "$RESULTS/gpu_tests.log" 2>&1; stamp lane0 gpu tests done ) &
  stamp lane0 eagle3
  RUNS=eagle3 MAX_PROMPTS=${METHOD_PROMPTS:-20} bash tools/gpu/methods45.sh $(extra_data) \
    > "$RESULTS/methods45_eagle3.log" 2>&1
  wait
  stamp lane0 runtime bench
  runtime_bench
  stamp lane0 done
}

lane_pair() {  # GPU $1 trains and benches runs $2 and $3 at once
  export CUDA_VISIBLE_DEVICES=$1
  for run in $2 $3; do
    ( RUNS=$run MAX_PROMPTS=${METHOD_PROMPTS:-20} bash tools/gpu/methods45.sh $(extra_data) \
        > "$RESULTS/methods45_$run.log" 2>&1
      stamp "lane$1 $run done" ) &
  done
  wait
}

kangaroo_sweep() {  # η × exit layer on every Kangaroo export that finished
  export CUDA_VISIBLE_DEVICES=3
  local exports=() waited=0
  while [ ! -f "$WORK/methods45/kangaroo2/export/model.safetensors" ] && [ $waited -lt 120 ]; do
    sleep 5; waited=$((waited + 5))
  done
  for dir in "$WORK"/methods45/kangaroo*/export; do [ -f "$dir/model.safetensors" ] && exports+=("$dir"); done
  [ ${#exports[@]} -gt 0 ] && timeout 420 python3 tools/bench_kangaroo.py "${exports[@]}" --eta 0 0.2 0.4 0.6 0.8 --choose-exit \
    --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts "${BENCH_PROMPTS:-10}" --max-new-tokens 256 \
    --out "$RESULTS/kangaroo_sweep" > "$RESULTS/kangaroo_sweep.log" 2>&1
  stamp kangaroo sweep done
}

plots() {
  for kind in chain tree; do
    labels=()
    for dir in "$WORK"/methods45/*/bench_$kind/bench.json; do
      name=${dir#"$WORK"/methods45/}; labels+=("${name%%/*}=$dir")
    done
    [ ${#labels[@]} -gt 0 ] && python3 tools/plot_acceptance.py --out "$RESULTS/acceptance_$kind.png" \
      --title "MT-bench, T=0, $kind ($STEPS steps)" "${labels[@]}" > "$RESULTS/acceptance_$kind.txt" 2>&1
  done
  for dir in "$WORK"/methods45/*/; do
    name=$(basename "$dir"); mkdir -p "$RESULTS/methods/$name"
    cp "$dir"/params.json "$dir"/train/meta.json "$RESULTS/methods/$name/" 2>/dev/null
    for kind in chain tree; do cp "$dir/bench_$kind/bench.json" "$RESULTS/methods/$name/bench_$kind.json" 2>/dev/null; done
  done
}

multi_gpu_tests() {  # correctness only (no timings): runs on GPUs 2 and 3 beside the method lanes
  CUDA_VISIBLE_DEVICES=2,3 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py \
    > "$RESULTS/gpu_tests_multi.log" 2>&1
  stamp multi-gpu tests done
}

all_gpus() {  # timings that need the whole machine to themselves
  export CUDA_VISIBLE_DEVICES=0,1,2,3
  stamp all bench_distill_scale
  timeout 240 python3 tools/bench_distill_scale.py --workers 1,2,4 --timeout 150 --out "$RESULTS/bench_distill" -- \
    "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts2.jsonl]" data.max_samples=1024 \
    distill.batch_size=256 distill.shard_size=256 distill.max_new_tokens=256 > "$RESULTS/bench_distill.log" 2>&1
  pack
  stamp all bench_scale
  timeout 420 python3 tools/bench_scale.py --gpus 1,2,4 --warmup 3 --steps 6 --timeout 100 --out "$RESULTS/bench_scale" \
    > "$RESULTS/bench_scale.log" 2>&1
  stamp all done
}

data_stage() {  # -> $EXTRA_DATA: 7,500 new conversations, trained on beside run 1's (train.extra_distilled)
  stamp data distill
  timeout 300 python3 tools/bench_distill_scale.py --workers 4 --out "$WORK/distill4" -- "target.path=$GGUF" \
    "data.prompts=[$PWD/.data/train_prompts2.jsonl]" distill.batch_size=256 distill.shard_size=256 \
    distill.max_new_tokens=256 > "$RESULTS/distill_data.log" 2>&1
  cp "$WORK/distill4/bench_distill_scale.json" "$RESULTS/distill_data_4workers.json" 2>/dev/null
  [ -f "$WORK/distill4/workers-4/counts.json" ] && export EXTRA_DATA=$WORK/distill4/workers-4
  stamp data ready: "${EXTRA_DATA:-run 1 only}"
  pack
}

pack() {  # $HOME/results.tgz: the small files of $RESULTS (what a device call copies back), rewritten at each stage
  (cd "$RESULTS" && find . -type f \( -name '*.json' -o -name '*.log' -o -name '*.png' -o -name '*.txt' -o -name '*.csv' \) \
     -size -4M -not -path './bench_scale/work/*' -not -path '*/dataset/*' -not -path '*/shards/*' -print0 \
     | tar czf "$HOME/results.tgz.part" --null -T - ) && mv "$HOME/results.tgz.part" "$HOME/results.tgz"
}

if [ "${1:-all}" = runtime ]; then  # one GPU: GPU runtime tests and an EAGLE-3 head on run 1's data, then the runtime bench
  export CUDA_VISIBLE_DEVICES=0 QUICK=1
  ( timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime > "$RESULTS/gpu_tests_runtime.log" 2>&1 ) &
  NAME=methods45/eagle3 RECIPE=recipes/eagle3_smollm2.yaml bash tools/gpu/train_head.sh > "$RESULTS/train_eagle3.log" 2>&1
  wait
  runtime_bench
  pack
  stamp session done
  exit 0
fi

stamp session start
data_stage
multi_gpu_tests &
lane0 & pids=($!)
( lane_pair 1 poss1 poss2; stamp bench_kernels
  timeout 240 python3 tools/bench_kernels.py --out "$RESULTS/bench_kernels.json" > "$RESULTS/bench_kernels.log" 2>&1
) & pids+=($!)
lane_pair 2 poss3 kangaroo2 & pids+=($!)
( lane_pair 3 kangaroo4 kangaroo8; kangaroo_sweep ) & pids+=($!)
wait "${pids[@]}"
plots
pack
wait  # the multi-GPU tests
all_gpus
pack
stamp session done
