#!/usr/bin/env bash
# Ready for the next session, on one 4-GPU machine, with tools/gpu/env.sh sourced (DEEPSPEED=1); SmolLM2 joined
# ($GGUF) and .data carried (prev, run2, mt_bench.jsonl) as tools/gpu/README.md says, for lr14. lr14 waits for
# the GGUF and for .data/prev and .data/run2: copy each in under another name and rename it.
#   scale14 (no SmolLM2, no data; about 11 minutes): issue 7 with the frozen target on PyTorch's own linear.
#          ZeRO-2 and ZeRO-3 on 1 and 4 GPUs in one call, 30 timed steps, every rank's phases; then both on 1 GPU
#          with the forward split into the target's part and the draft's (--split-forward): which one the host
#          limits under each. The runs alternate 1 and 4 GPUs, so their host canaries tell whether four busy
#          ranks slow the host (Session 13 saw it 27-61% slower in its 4-GPU run) or its pace drifts in time.
#   lr14 (about 14 minutes): whether Session 12-13's heads are held back by their learning rate, or training lost
#          something since the foundation's run 2 (τ_sim 2.98 after 2,500 steps of 32 rows at lr 5e-4, against
#          2.0 after 1,000 steps of 64 at 3e-4). Four EAGLE-3 heads on Session 6's data, one per GPU, validated
#          every 250 steps: run 2's settings again (its τ_sim by step is the baseline); the same at lr 1e-3, online
#          and with data.features=hybrid (the target runs in the first epoch only: how much faster the later
#          epochs train, and whether the head is the same); 1,000 steps of 64 rows at lr 1e-3. Each benched on the
#          same MAX_PROMPTS (80) MT-bench prompts. The 1,000-step head's GPU, free first, then benches chains and
#          trees of several shapes on 20 prompts (tools/bench_tree_shapes.py): which shape is fastest.
#   all14: lr14, then scale14.
set -u
source tools/gpu/session13.sh  # (and session5/6/7/12.sh) stamp, pack, wait_for_target, scale_runs, head_on, plot_heads

scale14() {
  mkdir -p "$RESULTS"
  stamp "session14 scale14 on $(nvidia-smi -L | wc -l) GPUs"
  STEPS3=30 scale_runs zero2 deepspeed_stage_2 1,4
  STEPS3=30 scale_runs zero3 deepspeed_stage_3 1,4
  STEPS3=20 scale_runs zero2_split deepspeed_stage_2 1 --split-forward
  STEPS3=20 scale_runs zero3_split deepspeed_stage_3 1 --split-forward
  stamp "session14 scale14 done"
}

shapes_on() {  # GPU $1, head label $2: tools/bench_tree_shapes.py over chains and trees, 20 MT-bench prompts
  local gpu=$1 label=$2
  stamp "tree shapes of $label"
  CUDA_VISIBLE_DEVICES=$gpu timeout 600 python3 tools/bench_tree_shapes.py "$HOME/work_$label/methods45/eagle3/export" \
    --shapes 6 8 6,8,48 6,4,24 6,8,32 5,8,32 8,8,64 8,4,32 --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 20 \
    --out "$RESULTS/shapes_$label" > "$RESULTS/shapes_$label.log" 2>&1
  tail -12 "$RESULTS/shapes_$label.log"
}

lr14() {
  mkdir -p "$RESULTS"
  wait_for_target
  for _ in $(seq 120); do [ -d "$PWD/.data/prev/data" ] && [ -d "$EXTRA_DATA" ] && break; sleep 5; done
  local data="train.extra_distilled=[$EXTRA_DATA]" run2=(train.micro_batch_size=32 train.max_steps=2500)
  stamp "lr14: extra data $EXTRA_DATA"
  head_on 0 run2_lr5e-4 eagle3 "$data" "${run2[@]}" train.lr=5e-4 train.val_every_steps=250 &
  head_on 1 run2_lr1e-3 eagle3 "$data" "${run2[@]}" train.lr=1e-3 train.val_every_steps=250 &
  ( head_on 2 mb64_lr1e-3 eagle3 "$data" train.max_steps=1000 train.lr=1e-3 train.val_every_steps=250
    shapes_on 2 mb64_lr1e-3 ) &
  head_on 3 run2_lr1e-3_hybrid eagle3 "$data" "${run2[@]}" train.lr=1e-3 train.val_every_steps=250 \
    data.features=hybrid &
  wait
  plot_heads run2_lr5e-4 run2_lr1e-3 mb64_lr1e-3 run2_lr1e-3_hybrid
  pack
  stamp "lr14 done"
}

all14() {
  lr14
  scale14
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all14}"; fi  # sourced: its functions only, status 0
