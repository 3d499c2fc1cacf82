#!/usr/bin/env bash
# The GPU measurements for one GPU (nvidia-h100-x1; no 4-GPU kind was lent in Session 8), as one orchestrator built
# on session5/6.sh's stages. Run it detached from a copy of the repository with tools/gpu/env.sh sourced
# (DEEPSPEED=1) and bitsandbytes installed; the stages that need SmolLM2's GGUF wait for it.
#   1 bench_train (issue 6), alone on the GPU: baseline and ours at 2048 (back-to-back steps, profiled), with the
#     fused 8-bit AdamW row; ours at 8192.
#   2 (at once) the second prompt set distilled on this GPU; every GPU test; the τ cost of a quantized target:
#     EAGLE-3 heads of $QUANT_STEPS steps on run 1's conversations against the target in bf16, 8-bit and 4-bit,
#     each benched against the bf16 target.
#   3 PosS-3 and Kangaroo ℓ=2 with Session 6's data, steps and seed (1,000 steps, micro-batch 64, eager), then the
#     Kangaroo tree with and without --shallow-reuse-tree, alone on the GPU.
set -u
export STEPS=${STEPS:-1000} CUDA_VISIBLE_DEVICES=0
source tools/gpu/session7.sh  # (and session5/6.sh) pack, stamp, heads, wait_for_target, collect, kangaroo_tree
QUANT_STEPS=${QUANT_STEPS:-400}

bench_stage() {
  stamp "1 bench_train"
  timeout 480 python3 tools/bench_train.py --seq-lens 2048 --warmup 3 --steps 8 --profile 2 \
    --rows baseline ours-swiglu ours-swiglu-8bit ours-swiglu-8bit-fused --out "$RESULTS/bench_train_2048.json" \
    > "$RESULTS/bench_train_2048.log" 2>&1
  timeout 240 python3 tools/bench_train.py --seq-lens 8192 --warmup 2 --steps 4 \
    --rows ours-swiglu-8bit-fused ours-8bit --out "$RESULTS/bench_train_8192.json" > "$RESULTS/bench_train_8192.log" 2>&1
  grep -v Recompil "$RESULTS/bench_train_2048.log" | tail -14
  pack
}

data_stage1() {  # -> $EXTRA_DATA: the second prompt set's conversations distilled on this one GPU
  timeout 900 python3 tools/bench_distill_scale.py --workers 1 --out "$WORK/distill1" -- "target.path=$GGUF" \
    "data.prompts=[$PWD/.data/train_prompts2.jsonl]" distill.batch_size=256 distill.shard_size=256 \
    distill.max_new_tokens=256 > "$RESULTS/distill_data.log" 2>&1
  cp "$WORK/distill1/workers-1/counts.json" "$RESULTS/distill_counts.json" 2>/dev/null
  stamp "data distilled: $(cat "$RESULTS/distill_counts.json" 2>/dev/null)"
}

gpu_tests() {
  timeout 600 python3 -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/test_multi_gpu.py \
    > "$RESULTS/gpu_tests.log" 2>&1
  stamp "gpu tests: $(tail -1 "$RESULTS/gpu_tests.log")"
}

quant_heads() {  # issue 6: what training against a quantized target costs in τ (each head benched on the bf16 target)
  local bench=(--target "$GGUF" --temperature 0 --no-hf --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 20
               --max-new-tokens 256)
  for quant in ${QUANTS:-none 8bit 4bit}; do
    local name=quant/$quant
    NAME=$name RECIPE=recipes/eagle3_smollm2.yaml STEPS=$QUANT_STEPS bash tools/gpu/train_head.sh \
      "target.quantization=$quant" train.micro_batch_size=64 \
      > "$RESULTS/quant_$quant.log" 2>&1 || { stamp "quant $quant failed"; continue; }
    python3 -m specdraft.cli bench "$WORK/$name/export" --chain --depth 6 "${bench[@]}" \
      --out "$RESULTS/quant/$quant/chain" >> "$RESULTS/quant_$quant.log" 2>&1
    python3 -m specdraft.cli bench "$WORK/$name/export" --depth 6 --topk 8 --budget 48 "${bench[@]}" \
      --out "$RESULTS/quant/$quant/tree" >> "$RESULTS/quant_$quant.log" 2>&1
    cp "$WORK/$name/train/train_summary.json" "$RESULTS/quant/$quant/" 2>/dev/null
    stamp "quant $quant done"
  done
}

all8() {
  rm -rf "${RESULTS:?}"/*; mkdir -p "$RESULTS"
  stamp "session8 start"
  bench_stage
  wait_for_target
  stamp "2 data, gpu tests, quantized targets"
  data_stage1 & gpu_tests & quant_heads &
  wait; pack
  [ -f "$WORK/distill1/workers-1/counts.json" ] && export EXTRA_DATA=$WORK/distill1/workers-1
  stamp "3 heads, $STEPS steps, extra data ${EXTRA_DATA:-none}"
  COMPILE=false
  ( heads 0 poss3 ) & ( heads 0 kangaroo2 ) &
  wait
  KANGAROO_GPU=0 kangaroo_tree
  collect; pack
  stamp "session8 done"
}

rest8() {  # a second one-GPU machine: what the first (held 30 minutes at most) did not reach, and the compiled-
  # gradient GPU test again; the second prompt set's conversations from $EXTRA_DATA
  stamp "session8 rest start"
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_train_perf.py > "$RESULTS/gpu_tests_compile.log" 2>&1
  stamp "compile test: $(tail -1 "$RESULTS/gpu_tests_compile.log")"
  wait_for_target
  ( QUANTS="8bit 4bit" quant_heads ) &
  ( COMPILE=false heads 0 kangaroo2 ) &
  wait
  KANGAROO_GPU=0 kangaroo_tree
  collect; pack
  stamp "session8 rest done"
}

[ "${BASH_SOURCE[0]}" = "$0" ] && "${1:-all8}"
