#!/usr/bin/env bash
# Session 5's GPU measurements (docs/benchmarks.md, "Session 5"). Run from a copy of the repository on the GPU
# machine after the SmolLM2 calls of ../shared/gpu/README.md, with tools/gpu/env.sh sourced (DEEPSPEED=1 for x4).
#   probe (one GPU):  where a SmolLM2 training step's time goes (tools/profile_train.py), bench_train's rows at
#                     2048 tokens on this card, and the runtime's GPU tests.
#   scale (2+ GPUs):  issue 7's checks: tests/test_multi_gpu.py, the compiled-gradients GPU test, ZeRO-3 scaling.
#   x4 (4 GPUs):      distill the second prompt set on 4 GPUs; EAGLE-3, PosS-1, PosS-2 and Kangaroo (ℓ 2, 4) heads
#                     trained with the same data, steps and seed (micro-batch 64) and benched on MT-bench;
#                     the runtime bench of the EAGLE-3 head; tests/test_multi_gpu.py; bench_scale with ZeRO-3.
# Results go to $RESULTS; `pack` bundles the small ones into $HOME/results.tgz (what a device call brings back).
set -u
export RESULTS=${RESULTS:-$HOME/results} WORK=${WORK:-$HOME/work}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$RESULTS" "$WORK"
stamp() { echo "=== $* $(date +%T)"; }
DATA=${DATA:-$PWD/.data/prev/data}
head_args=("target.path=$GGUF" "distill.output_dir=$DATA" train.micro_batch_size=16 train.lr=3e-4
           train.warmup_steps=100 train.seed=0 data.max_length=1024 data.val_fraction=0.02)

pack() {
  (cd "$RESULTS" && find . -type f \( -name '*.json' -o -name '*.log' -o -name '*.png' -o -name '*.txt' -o -name '*.csv' \) \
     -size -4M -not -path '*/train/*' -print0 | tar czf "$HOME/results.tgz.part" --null -T - ) \
     && mv "$HOME/results.tgz.part" "$HOME/results.tgz"
}

probe() {
  export CUDA_VISIBLE_DEVICES=0
  stamp profile smollm2 eagle3
  timeout 240 python3 tools/profile_train.py recipes/eagle3_smollm2.yaml "${head_args[@]}" --warmup 30 --steps 10 \
    --top 30 --out "$RESULTS/profile_eagle3" > "$RESULTS/profile_eagle3.log" 2>&1
  pack
  stamp bench_train
  timeout 300 python3 tools/bench_train.py --seq-lens 2048 --rows ours ours-no-ckpt offline \
    --out "$RESULTS/bench_train.json" > "$RESULTS/bench_train.log" 2>&1
  pack
  stamp gpu runtime tests
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/runtime > "$RESULTS/gpu_tests_runtime.log" 2>&1
  pack
  stamp probe done
}

speed() {  # steps per second of the SmolLM2 heads at two micro-batch sizes (a few profiled steps at the end)
  export CUDA_VISIBLE_DEVICES=0
  for run in "eagle3 16 recipes/eagle3_smollm2.yaml" "eagle3 64 recipes/eagle3_smollm2.yaml" \
             "poss2 64 recipes/poss_smollm2.yaml method.positions_per_specialist=2 method.num_specialists=3" \
             "kangaroo4 64 recipes/kangaroo_smollm2.yaml method.exit_layer=4"; do
    read -r -a words <<< "$run"
    stamp "speed ${words[0]} batch ${words[1]}"
    timeout 150 python3 tools/profile_train.py "${words[2]}" "${head_args[@]}" "train.micro_batch_size=${words[1]}" \
      "${words[@]:3}" --warmup 60 --steps 5 --top 40 --out "$RESULTS/speed_${words[0]}_b${words[1]}" \
      > "$RESULTS/speed_${words[0]}_b${words[1]}.log" 2>&1
    grep -h "^run: \|ms wall" "$RESULTS/speed_${words[0]}_b${words[1]}.log" | tail -2
  done
  pack
}

compiled() {  # train.compile on and off for the SmolLM2 EAGLE-3 head; bench_train's rows at 2048
  export CUDA_VISIBLE_DEVICES=0
  for setting in true false; do
    stamp "speed eagle3 batch 64 compile=$setting"
    TORCH_LOGS=recompiles timeout 200 python3 tools/profile_train.py recipes/eagle3_smollm2.yaml "${head_args[@]}" \
      train.micro_batch_size=64 "train.compile=$setting" --warmup 60 --steps 5 --top 40 \
      --out "$RESULTS/compile_${setting}" > "$RESULTS/compile_${setting}.log" 2>&1
    grep -h "^run: \|ms wall" "$RESULTS/compile_${setting}.log" | tail -2
    grep -c "Recompiling" "$RESULTS/compile_${setting}.log"
  done
  pack
  stamp bench_train
  TORCH_LOGS=recompiles timeout 330 python3 tools/bench_train.py --seq-lens 2048 --warmup 3 --steps 6 \
    --rows ours-no-ckpt ours-swiglu ours-selective ours ${BENCH_TRAIN_ROWS:-} --profile 2 --out "$RESULTS/bench_train_perf.json" \
    > "$RESULTS/bench_train_perf.log" 2>&1
  grep -v Recompil "$RESULTS/bench_train_perf.log" | tail -12
  pack
}

heads() {  # GPU $1: method runs $2.. one after another (COMPILE=true: compiled, retried eagerly if that failed)
  export CUDA_VISIBLE_DEVICES=$1; shift
  for run in "$@"; do
    local common=(train.micro_batch_size=64 train.val_every_steps=400 $(extra_data))
    RUNS=$run MAX_PROMPTS=${MAX_PROMPTS:-20} bash tools/gpu/methods45.sh "${common[@]}" "train.compile=${COMPILE:-false}" \
      > "$RESULTS/methods45_$run.log" 2>&1 \
      || RUNS=$run MAX_PROMPTS=${MAX_PROMPTS:-20} bash tools/gpu/methods45.sh "${common[@]}" train.compile=false \
      > "$RESULTS/methods45_${run}_eager.log" 2>&1
    stamp "head $run done"
  done
}

extra_data() { [ -n "${EXTRA_DATA:-}" ] && echo "train.extra_distilled=[$EXTRA_DATA]"; }

data_stage() {  # -> $EXTRA_DATA: the second prompt set's conversations, beside run 1's (.data/prev/data)
  stamp data distill
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 300 python3 tools/bench_distill_scale.py --workers 4 --out "$WORK/distill4" -- \
    "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts2.jsonl]" distill.batch_size=256 \
    distill.shard_size=256 distill.max_new_tokens=256 > "$RESULTS/distill_data.log" 2>&1
  [ -f "$WORK/distill4/workers-4/counts.json" ] && export EXTRA_DATA=$WORK/distill4/workers-4
  cp "$WORK/distill4/workers-4/counts.json" "$RESULTS/distill_counts.json" 2>/dev/null
  stamp data ready: "${EXTRA_DATA:-run 1 only}"
}

runtime_bench() {  # issue 3 on the EAGLE-3 head: HF generate, plain and speculative (tree and chain, T=0 and T=1)
  export CUDA_VISIBLE_DEVICES=0
  local export_dir=$WORK/methods45/eagle3/export mt=(--prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 10 --max-new-tokens 256)
  python3 -m specdraft.cli bench "$export_dir" --temperature 0 1 "${mt[@]}" --depth 6 --topk 8 --budget 48 \
    --out "$RESULTS/runtime_tree" > "$RESULTS/runtime_tree.log" 2>&1
  python3 -m specdraft.cli bench "$export_dir" --temperature 0 "${mt[@]}" --chain --depth 6 --no-hf \
    --out "$RESULTS/runtime_chain" > "$RESULTS/runtime_chain.log" 2>&1
  python3 -m specdraft.cli bench "$export_dir" --temperature 0 "${mt[@]}" --depth 8 --topk 8 --budget 64 --no-hf \
    --out "$RESULTS/runtime_tree_d8" > "$RESULTS/runtime_tree_d8.log" 2>&1
  stamp runtime bench done
}

kangaroo_sweep() {
  export CUDA_VISIBLE_DEVICES=3
  timeout 300 python3 tools/bench_kangaroo.py "$WORK"/methods45/kangaroo2/export "$WORK"/methods45/kangaroo4/export \
    --eta 0 0.2 0.4 0.6 --choose-exit --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 10 --max-new-tokens 256 \
    --out "$RESULTS/kangaroo_sweep" > "$RESULTS/kangaroo_sweep.log" 2>&1
  stamp kangaroo sweep done
}

collect() {  # each head's params, train summary and benches into $RESULTS/methods/<run>
  for dir in "$WORK"/methods45/*/; do
    name=$(basename "$dir"); mkdir -p "$RESULTS/methods/$name"
    cp "$dir"/params.json "$dir"/train/train_summary.json "$RESULTS/methods/$name/" 2>/dev/null
    for kind in chain tree; do cp "$dir/bench_$kind/bench.json" "$RESULTS/methods/$name/bench_$kind.json" 2>/dev/null; done
  done
}

x4() {
  rm -rf "$RESULTS"/*; mkdir -p "$RESULTS"
  export STEPS=${STEPS:-1000}
  stamp x4 start
  data_stage; pack
  ( heads 0 eagle3; runtime_bench; touch "$WORK/lane0.done" ) &
  ( heads 1 poss1; touch "$WORK/lane1.done" ) &
  ( heads 2 poss2; touch "$WORK/lane2.done" ) &
  ( heads 3 kangaroo2 & heads 3 kangaroo4; wait; kangaroo_sweep; touch "$WORK/lane3.done" ) &
  while [ ! -f "$WORK/lane1.done" ] || [ ! -f "$WORK/lane2.done" ]; do sleep 5; done
  stamp multi-gpu tests
  CUDA_VISIBLE_DEVICES=1,2 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py \
    > "$RESULTS/gpu_tests_multi.log" 2>&1
  stamp multi-gpu tests done; collect; pack
  wait
  collect; pack
  stamp bench_scale zero3
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 300 python3 tools/bench_scale.py --gpus 1,2,4 --strategies deepspeed_stage_3 \
    --warmup 3 --steps 6 --timeout 90 --out "$RESULTS/bench_scale_zero3" > "$RESULTS/bench_scale_zero3.log" 2>&1
  pack
  stamp x4 done
}

scale() {  # no SmolLM2 needed: tiny targets and random 8B-shaped ones
  rm -rf "$RESULTS"/*; mkdir -p "$RESULTS"
  stamp scale tests
  CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py \
    > "$RESULTS/gpu_tests_multi.log" 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_train_perf.py \
    > "$RESULTS/gpu_tests_compile.log" 2>&1
  pack
  stamp scale bench_scale zero3
  timeout 330 python3 tools/bench_scale.py --strategies deepspeed_stage_3 --warmup 3 --steps 6 --timeout 100 \
    --out "$RESULTS/bench_scale_zero3" > "$RESULTS/bench_scale_zero3.log" 2>&1
  pack
  stamp scale done
}

[ "${BASH_SOURCE[0]}" = "$0" ] && "${1:-probe}"  # sourced (session6.sh): its functions only
