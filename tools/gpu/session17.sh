#!/usr/bin/env bash
# Ready for the next session, on one 4-GPU machine, with tools/gpu/env.sh sourced (DEEPSPEED=1); SmolLM2 joined
# ($GGUF), .data/train_prompts.jsonl, train_prompts2.jsonl and mt_bench.jsonl carried, and Session 16's EAGLE-3
# export carried as .exports/eagle3_s16.tgz (no training needed for the runtime's questions).
#   runtime17 (about 6.5 minutes, first, alone): that head benched again on all 80 prompts (chain 6, tree 6,8,48):
#          bench.json's cycle_profile now has plain_step_ms and the host's time to issue each graph. Plain
#          decoding took about 0.4 ms a token more than its launches suggested and one step in flight did not
#          change it (Session 16): is the plain step's graph itself that slow (the device), or is the host slow
#          to issue it? tools/trace_decoding.py then sets the device's kernel time against the wall clock, per
#          plain step and per cycle, and 20 prompts of the tree run under py-spy (native frames): where the
#          host's time goes. ab17: the chain's cycle against Session 16's benched runtime (.old, carried).
#   distill15 (about 5.5 minutes), with gpu16 beside it: the training data again, the runtime's GPU tests.
#   heads17 (about 14 minutes): issue 4 from the trained EAGLE-3 head (method.init_from): PosS-2 at lr 3e-4 and
#          1e-3, PosS-1 at 3e-4, 1,000 steps each, on GPUs 0-2; Kangaroo l=2 and l=4 again on GPU 3 (Session 16's
#          sweep did not run). Then the PosS heads' τ (80 prompts, beside each other), Kangaroo's l x η sweep
#          with DEL choosing l, alone, on 10 prompts (last: the time may run out first).
#   all17: runtime17, then gpu16 beside distill15, then heads17.
set -u
source tools/gpu/session16.sh  # (and session5-15.sh) stamp, pack, distill15, train15, bench15, plot_tagged, gpu16
EAGLE3=$HOME/work_eagle3_s16/methods45/eagle3/export  # where bench15 0 eagle3_s16 eagle3 finds it

runtime17() {
  mkdir -p "$RESULTS" "$(dirname "$EAGLE3")"
  for _ in $(seq 120); do [ -f .exports/eagle3_s16.tgz ] && break; sleep 5; done  # the third call carries it
  tar xzf .exports/eagle3_s16.tgz -C "$(dirname "$EAGLE3")"
  wait_for_target
  bench15 0 eagle3_s16 eagle3 _alone
  CUDA_VISIBLE_DEVICES=0 timeout 120 python3 tools/trace_decoding.py "$EAGLE3" --prompts "$PWD/.data/mt_bench.jsonl" \
    --tokens 256 --out "$RESULTS/trace_decoding" > "$RESULTS/trace_decoding.log" 2>&1
  stamp "traced: $(head -3 "$RESULTS/trace_decoding.log" | tail -2 | tr -s ' ' | tr '\n' ';')"
  ab17
  stamp "py-spy: 20 prompts of the tree"
  CUDA_VISIBLE_DEVICES=0 timeout 150 /tmp/site/bin/py-spy record -r 200 --native -f raw \
    -o "$RESULTS/tree_pyspy_native.txt" -- python3 -m specdraft.cli bench "$EAGLE3" --temperature 0 --no-hf \
    --lossless-prompts 0 --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 20 --out "$RESULTS/pyspy_bench" \
    > "$RESULTS/tree_pyspy.log" 2>&1
  pack
}

ab17() {  # the kept head's chain of 6 on 20 prompts, alone: this runtime and Session 16's benched one (.old, from
  # d76a698: the exit flag and the tree's per-depth tables not yet trimmed), in turn, twice
  local round run
  for round in 1 2; do
    for run in new old; do
      local where=$PWD; [ "$run" = old ] && where=$PWD/.old
      [ -d "$where/specdraft" ] || continue
      (cd "$where" && PYTHONPATH=$where:$PYTHONPATH CUDA_VISIBLE_DEVICES=0 timeout 180 python3 -m specdraft.cli bench \
        "$EAGLE3" --chain --depth 6 --exit-threshold 0 --temperature 0 --no-hf --lossless-prompts 0 \
        --prompts "$OLDPWD/.data/mt_bench.jsonl" --max-prompts 20 --out "$RESULTS/ab17/${run}$round") \
        > "$RESULTS/ab17_${run}$round.log" 2>&1
      stamp "ab17 $run$round: $(tail -1 "$RESULTS/ab17_${run}$round.log")"
    done
  done
  pack
}

heads17() {
  mkdir -p "$RESULTS"
  local init=method.init_from=$EAGLE3 steps=train.max_steps=1000 warm=train.warmup_steps=50
  train15 0 poss2_init_lr3e-4 poss2 "$init" "$steps" "$warm" train.lr=3e-4 &
  train15 1 poss2_init_lr1e-3 poss2 "$init" "$steps" "$warm" &
  train15 2 poss1_init_lr3e-4 poss1 "$init" "$steps" "$warm" train.lr=3e-4 &
  ( train15 3 kangaroo2_lr1e-3 kangaroo2; train15 3 kangaroo4_lr1e-3 kangaroo4 ) &
  wait
  pack
  bench15 0 poss2_init_lr3e-4 poss2 _busy &  # their τ: it ignores the host's load
  bench15 1 poss2_init_lr1e-3 poss2 _busy &
  bench15 2 poss1_init_lr3e-4 poss1 _busy &
  wait
  plot_tagged _busy poss2_init_lr3e-4 poss2_init_lr1e-3 poss1_init_lr3e-4
  pack
  stamp "kangaroo sweep"
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 tools/bench_kangaroo.py \
    "$HOME/work_kangaroo2_lr1e-3/methods45/kangaroo2/export" "$HOME/work_kangaroo4_lr1e-3/methods45/kangaroo4/export" \
    --eta 0 0.3 0.5 0.7 --depth 6 --choose-exit --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 10 \
    --out "$RESULTS/kangaroo_sweep" > "$RESULTS/kangaroo_sweep.log" 2>&1
  pack
  stamp "heads17 done"
}

all17() {
  runtime17
  gpu16 &
  distill15
  wait
  stamp "gpu tests: $(tail -1 "$RESULTS/gpu_tests.log" 2>/dev/null)"
  heads17
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all17}"; fi  # sourced: its functions only, status 0
