#!/usr/bin/env bash
# The next GPU session's measurements on one 4-GPU machine, as one orchestrator (session6.sh's stages, with what
# Session 6 left open). Run it detached from a copy of the repository with tools/gpu/env.sh sourced (DEEPSPEED=1)
# and bitsandbytes installed; the stages that need SmolLM2's GGUF wait for it.
#   1 checks:   GPUs 0,1 tests/test_multi_gpu.py (ZeRO-3 with a whole and a partitioned target); GPU 2 the
#               compiled-gradient test, then every other GPU test; GPU 3 bench_train with back-to-back steps
#               (rows BENCH_ROWS, profiled) and at 8192: session6.sh's `checks`.
#   2 scaling:  bench_scale with ZeRO-2 and ZeRO-3 on 1, 2 and 4 GPUs in one run (issue 7).
#   3 data:     the second prompt set distilled on 4 GPUs.
#   4 heads:    EAGLE-3, PosS-1/2/3 and Kangaroo ℓ 2 with $STEPS steps (compiled if stage 1's test passed); the
#               runtime bench of the EAGLE-3 head; the Kangaroo tree with and without --shallow-reuse-tree.
set -u
BENCH_ROWS=${BENCH_ROWS:-baseline ours-no-ckpt ours-swiglu ours-swiglu-8bit ours-swiglu-8bit-fused ours-8bit}
MULTI_TIMEOUT=480 REST_TIMEOUT=330 BENCH_TIMEOUT=360  # four multi-GPU cases; more GPU tests and rows
export STEPS=${STEPS:-2000}  # before session6.sh, whose default is 1000
source tools/gpu/session6.sh  # stage 1 (checks), wait_for_target, compiled_heads (and session5's stages)

scaling7() {
  stamp "2 bench_scale zero2 + zero3"
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 540 python3 tools/bench_scale.py --gpus 1,2,4 \
    --strategies deepspeed_stage_2,deepspeed_stage_3 --warmup 3 --steps 6 --timeout 100 \
    --out "$RESULTS/bench_scale" > "$RESULTS/bench_scale.log" 2>&1
  tail -10 "$RESULTS/bench_scale.log"
  pack
}

kangaroo_tree() {  # GPU ${KANGAROO_GPU:-3}: the Kangaroo ℓ=2 tree with and without the shallow reuse, same prompts
  export CUDA_VISIBLE_DEVICES=${KANGAROO_GPU:-3}
  local export_dir=$WORK/methods45/kangaroo2/export mt=(--prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 10
    --max-new-tokens 256 --temperature 0 --no-hf --depth 6 --topk 8 --budget 48)
  python3 -m specdraft.cli bench "$export_dir" "${mt[@]}" --out "$RESULTS/kangaroo_tree_full" \
    > "$RESULTS/kangaroo_tree_full.log" 2>&1
  python3 -m specdraft.cli bench "$export_dir" "${mt[@]}" --shallow-reuse-tree --out "$RESULTS/kangaroo_tree_reuse" \
    > "$RESULTS/kangaroo_tree_reuse.log" 2>&1
  stamp "kangaroo tree done"
}

lane3_session7() { heads 3 kangaroo2; kangaroo_tree; heads 3 poss3; }

all7() { run_session session7 scaling7 lane3_session7; }

[ "${BASH_SOURCE[0]}" = "$0" ] && "${1:-all7}"
