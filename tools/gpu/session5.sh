#!/usr/bin/env bash
# Session 5's GPU measurements (docs/benchmarks.md, "Session 5"). Run from a copy of the repository on the GPU
# machine after the SmolLM2 calls of ../shared/gpu/README.md, with tools/gpu/env.sh sourced (DEEPSPEED=1 for x4).
#   probe (one GPU):  where a SmolLM2 training step's time goes (tools/profile_train.py), bench_train's rows at
#                     2048 tokens on this card, and the runtime's GPU tests.
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
    --rows ours-no-ckpt ours-swiglu ours-selective ours ${BENCH_TRAIN_ROWS:-} --out "$RESULTS/bench_train_perf.json" \
    > "$RESULTS/bench_train_perf.log" 2>&1
  grep -v Recompil "$RESULTS/bench_train_perf.log" | tail -12
  pack
}

"${1:-probe}"
