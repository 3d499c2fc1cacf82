#!/usr/bin/env bash
# Ready for the next session, on one 4-GPU machine, with tools/gpu/env.sh sourced (DEEPSPEED=1); SmolLM2 joined
# ($GGUF) and .data/train_prompts.jsonl, train_prompts2.jsonl (tools/prepare_prompts.py) and mt_bench.jsonl carried.
# What Session 15's device time did not reach: issues 4 and 5 at the EAGLE-3 head's best schedule (32 rows a
# step, 2,500 steps, lr 1e-3).
#   distill15 (about 5.5 minutes): the 11.3k training prompts answered again, greedy, 4 workers.
#   heads16 (about 16 minutes): EAGLE-3 (the reference), PosS-1 and PosS-2 on GPUs 0-2, Kangaroo l=2 then l=4 on
#          GPU 3, all on that data. Then the three EAGLE-3/PosS heads benched at once (their τ on the 80 MT-bench
#          prompts: issue 4's figure; τ does not depend on the host's load), then Kangaroo l=2 alone (its speed:
#          issue 5's figure) and the Kangaroo l x η sweep with DEL choosing l, alone, on 20 prompts. Every bench
#          also checks its first 10 prompts in float32 (bench.json's lossless_float32).
#          Before the sweep, the EAGLE-3 head's tree alone on 20 prompts with one step in flight (the default)
#          and without (--no-overlap), in that order, then again: what the overlap gives plain and speculative
#          decoding (both loops use it).
#   gpu16 (beside distill15, on GPU 3): the GPU tests of the runtime (the graphed engine with one step in flight
#          against the eager one without). If they do not pass, every bench runs with --no-overlap.
#   all16: gpu16 and distill15, then heads16.
set -u
source tools/gpu/session15.sh  # (and session5-14.sh) stamp, pack, distill15, train15, bench15, plot_tagged

heads16() {
  mkdir -p "$RESULTS"
  stamp "heads16: data $DATA"
  train15 0 eagle3_lr1e-3 eagle3 &
  train15 1 poss1_lr1e-3 poss1 &
  train15 2 poss2_lr1e-3 poss2 &
  ( train15 3 kangaroo2_lr1e-3 kangaroo2; train15 3 kangaroo4_lr1e-3 kangaroo4 ) &
  wait
  pack
  bench15 0 eagle3_lr1e-3 eagle3 _busy &
  bench15 1 poss1_lr1e-3 poss1 _busy &
  bench15 2 poss2_lr1e-3 poss2 _busy &
  wait
  plot_tagged _busy eagle3_lr1e-3 poss1_lr1e-3 poss2_lr1e-3
  pack
  bench15 0 kangaroo2_lr1e-3 kangaroo2 _alone
  pack
  overlap16
  stamp "kangaroo sweep"
  CUDA_VISIBLE_DEVICES=0 timeout 480 python3 tools/bench_kangaroo.py \
    "$HOME/work_kangaroo2_lr1e-3/methods45/kangaroo2/export" "$HOME/work_kangaroo4_lr1e-3/methods45/kangaroo4/export" \
    --eta 0 0.3 0.5 0.7 --depth 6 --choose-exit --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 20 \
    --out "$RESULTS/kangaroo_sweep" > "$RESULTS/kangaroo_sweep.log" 2>&1
  pack
  stamp "heads16 done"
}

overlap16() {  # the EAGLE-3 head's default tree on 20 prompts, alone: overlap on, off, on, off
  local export=$HOME/work_eagle3_lr1e-3/methods45/eagle3/export run flag
  for run in on1 off1 on2 off2; do
    flag=(); [[ $run == off* ]] && flag=(--no-overlap)
    CUDA_VISIBLE_DEVICES=0 timeout 180 python3 -m specdraft.cli bench "$export" --temperature 0 --no-hf \
      --lossless-prompts 0 --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 20 "${flag[@]}" \
      --out "$RESULTS/overlap/$run" > "$RESULTS/overlap_$run.log" 2>&1
    stamp "overlap $run: $(tail -1 "$RESULTS/overlap_$run.log")"
  done
  pack
}

gpu16() {
  mkdir -p "$RESULTS"
  CUDA_VISIBLE_DEVICES=3 timeout 300 python3 -m pytest -q -m gpu tests/runtime > "$RESULTS/gpu_tests.log" 2>&1
  stamp "gpu tests: $(tail -1 "$RESULTS/gpu_tests.log")"
}

all16() {
  gpu16 &
  distill15
  wait
  local summary
  summary=$(tail -1 "$RESULTS/gpu_tests.log" 2>/dev/null)  # pytest's last line: "N passed, M skipped in S s"
  if [[ $summary != *" passed"* || $summary == *failed* || $summary == *error* ]]; then
    export BENCH_EXTRA=--no-overlap  # the runtime's GPU tests did not pass: bench with the loop of Session 15
    stamp "GPU tests did not pass: benches run with $BENCH_EXTRA"
  fi
  heads16
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all16}"; fi  # sourced: its functions only, status 0
