#!/usr/bin/env bash
# Ready for the next session, on one machine of 4 GPUs (2 also work, with less), with tools/gpu/env.sh sourced
# (DEEPSPEED=1); SmolLM2 joined ($GGUF), .data/mt_bench.jsonl, Session 16's EAGLE-3 export (.exports/eagle3_s16.tgz),
# Session 18's greedy set (.data/distilled_s18.tgz: its 11,209 answers) and the training prompts carried.
#   gaps19 (about 4 minutes, first, alone): the fused tree frontier's GPU test (on failure every run takes its
#          reference); tools/plain_loop_gaps.py on Session 16's head and SmolLM2, 20 MT-bench prompts in bench's
#          order and blocked, the garbage collector on and off, every prompt's prefill alone (Session 18: the
#          plain loop on a random target ran at its graph's pace, 0.964 against 0.953 ms a step, while bench's
#          plain decoding of SmolLM2 took 1.41-1.54 ms a token: if that is an artefact of bench, the speedups over
#          plain are overstated, issue 3); ab19: the tree with the fused frontier against its reference, 20
#          prompts each (the graphed cycle: 554 launches against 589 counted on the CPU).
#   sampled19 (about 5 minutes, 4 GPUs only): the training prompts answered once more, sampled at T=0.8: Session
#          18's long head nearly exhausted the greedy set (held-out τ_sim 3.415, 3.447, 3.450 at its last three
#          checkpoints, 14.6 passes), so more τ needs more answers. Kept by keep19 in the last call.
#   heads19 (about 15 minutes on 4 GPUs): issue 4's fair comparison: PosS-2 and EAGLE-3 each warm-started from
#          Session 16's head (method.init_from), 1,000 steps at lr 3e-4, side by side (GPUs 2 and 3), then their
#          τ; Session 18 compared PosS-2 so trained with the head it started from (+4.0% chain, +3.3% tree), which
#          had 1,000 steps less. Beside them the long EAGLE-3 head on the greedy and the sampled set (GPUs 0,1,
#          64 rows a step, 2,500 steps; the split keeps a prompt's two answers on one side), kept by keep19; then
#          Kangaroo l=2 on GPU 2. The long head and Kangaroo are benched alone at the end (issues 3 and 5).
#   all19: gaps19, sampled19, then heads19.
#   rerun19 (what Session 19 ran on its second machine, after losing the first): firstseen19 (each prompt's first
#          prefill against its second, under cProfile), Session 16's head benched again, issue 4's comparison.
set -u
source tools/gpu/session18.sh  # (and session5-17.sh) stamp, pack, train15, bench15, plot_tagged, long18, keep_data
export DATA=$WORK/greedy/workers-4  # Session 18's set, unpacked by data19
SAMPLED=$WORK/sampled/workers-4  # sampled19's set
LONG=eagle3_long19

data19() {  # the carried set into $DATA's folder
  for _ in $(seq 120); do [ -f .data/distilled_s18.tgz ] && break; sleep 5; done  # the third call carries it
  mkdir -p "$WORK/greedy" && tar xzf .data/distilled_s18.tgz -C "$WORK/greedy" && stamp "data: $(du -sh "$DATA")"
}

gaps19() {
  mkdir -p "$RESULTS" "$(dirname "$EAGLE3")"
  CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_kernels_gpu.py -k frontier \
    > "$RESULTS/frontier_gpu_test.log" 2>&1
  local summary
  summary=$(tail -1 "$RESULTS/frontier_gpu_test.log")  # pytest's last line: "N passed, M deselected in S s"
  if [[ $summary != *" passed"* || $summary == *failed* || $summary == *error* ]]; then
    export SPECDRAFT_KERNELS=reference:tree_frontier  # the new kernel failed on the GPU: its reference, every run
  fi
  stamp "frontier kernel on the GPU: $summary; SPECDRAFT_KERNELS=${SPECDRAFT_KERNELS:-auto}"
  for _ in $(seq 120); do [ -f .exports/eagle3_s16.tgz ] && break; sleep 5; done  # the second call carries it
  tar xzf .exports/eagle3_s16.tgz -C "$(dirname "$EAGLE3")"
  wait_for_target
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 tools/plain_loop_gaps.py --export "$EAGLE3" --target "$GGUF" \
    --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 20 --repeats 1 --out "$RESULTS/gaps_real" \
    > "$RESULTS/gaps_real.log" 2>&1
  stamp "gaps, SmolLM2: $(grep -c plain_ "$RESULTS/gaps_real.log") plain rows"
  ab19
  pack
}

ab19() {  # Session 16's head, its default tree, 20 prompts, alone: the fused frontier (new) against its reference
  local run
  for run in new reference; do
    local kernels=${SPECDRAFT_KERNELS:-auto}
    [ "$run" = reference ] && kernels=reference:tree_frontier
    SPECDRAFT_KERNELS=$kernels CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m specdraft.cli bench "$EAGLE3" \
      --target "$GGUF" --temperature 0 --no-hf --lossless-prompts 0 --prompts "$PWD/.data/mt_bench.jsonl" \
      --max-prompts 20 --out "$RESULTS/ab19/$run" > "$RESULTS/ab19_$run.log" 2>&1
    stamp "ab19 $run ($kernels): $(grep -o '"tau".*' "$RESULTS/ab19_$run.log" | head -1 | cut -c1-120)"
  done
}

sampled19() {
  [ "$NGPU" -ge 4 ] || { stamp "sampled19 skipped: $NGPU GPUs"; return; }
  for _ in $(seq 120); do [ -f "$PWD/.data/train_prompts2.jsonl" ] && break; sleep 5; done
  stamp "sampled19: the training prompts answered again, T=0.8, 4 workers"
  CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 600 python3 tools/bench_distill_scale.py --workers 4 --out "$WORK/sampled" \
    -- "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts.jsonl,$PWD/.data/train_prompts2.jsonl]" \
    distill.batch_size=512 distill.shard_size=256 distill.max_new_tokens=256 distill.temperature=0.8 distill.seed=1 \
    > "$RESULTS/distill_sampled.log" 2>&1
  cp "$SAMPLED/counts.json" "$RESULTS/sampled_counts.json" 2>/dev/null
  stamp "sampled set: $(tr -d '\n ' < "$RESULTS/sampled_counts.json" 2>/dev/null)"
  pack
}

warm19() {  # GPU $1, label $2, run $3 (eagle3 or poss2): warm-started from Session 16's head, then its τ (busy)
  train15 "$1" "$2" "$3" "method.init_from=$EAGLE3" train.max_steps=1000 train.warmup_steps=50 train.lr=3e-4
  bench15 "$1" "$2" "$3" _busy
}

heads19() {
  data19
  if [ "$NGPU" -lt 4 ]; then  # two GPUs: the fair comparison, then Kangaroo alone; no long head
    warm19 0 eagle3_warm_s16 eagle3 & warm19 1 poss2_warm_s16 poss2 & wait
    train15 0 kangaroo2_s19 kangaroo2
  else
    ( warm19 2 eagle3_warm_s16 eagle3; train15 2 kangaroo2_s19 kangaroo2 ) &
    warm19 3 poss2_warm_s16 poss2 &
    local extra=()
    [ -f "$SAMPLED/counts.json" ] && extra=("train.extra_distilled=[$SAMPLED]")
    long18 0,1 wait "${extra[@]}"  # its bench waits for the two above: alone
  fi
  plot_tagged _busy eagle3_warm_s16 poss2_warm_s16  # issue 4: the same start, the same steps
  pack
  bench15 0 kangaroo2_s19 kangaroo2 _alone
  costs19
  pack
  stamp "heads19 done"
}

costs19() {  # every bench's cost a prompt and a cost a step beside its graphs (tools/loop_costs.py)
  local runs=() file
  for file in "$RESULTS"/heads/*/bench_*.json; do [ -f "$file" ] && runs+=("$(basename "$(dirname "$file")")/$(basename "$file" .json)=$file"); done
  [ ${#runs[@]} -gt 0 ] && python3 tools/loop_costs.py "${runs[@]}" --out "$RESULTS" > "$RESULTS/loop_costs.log" 2>&1
}

keep19() {  # the long head's export and the sampled set, in 15 MB parts under $1 (the last call's $OUT)
  tar czf "$HOME/long_export.tgz" -C "$HOME/work_$LONG/methods45/eagle3" export \
    && split -b 15M -d "$HOME/long_export.tgz" "$1/long_export.tgz.part"
  [ -d "$SAMPLED" ] && tar czf "$HOME/sampled.tgz" -C "$WORK/sampled" workers-4 \
    && split -b 15M -d "$HOME/sampled.tgz" "$1/sampled.tgz.part"
}

firstseen19() {  # each prompt's prefill the first time its length is met and again, under cProfile (GPU 0)
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 tools/plain_loop_gaps.py --export "$EAGLE3" --target "$GGUF" \
    --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 20 --first-seen --out "$RESULTS/first_seen" \
    > "$RESULTS/first_seen.log" 2>&1
  stamp "first seen: $(grep -c 'ms first' "$RESULTS/first_seen.log") prompts"
}

rerun19() {  # Session 19's second machine (the first was released mid-run): the probe, issue 4's fair
  # comparison, and Session 16's head benched with every prompt length met before the timed loops
  mkdir -p "$RESULTS" "$(dirname "$EAGLE3")"
  for _ in $(seq 120); do [ -f .exports/eagle3_s16.tgz ] && break; sleep 5; done
  tar xzf .exports/eagle3_s16.tgz -C "$(dirname "$EAGLE3")"
  wait_for_target
  ( firstseen19; bench15 0 eagle3_s16 eagle3 _busy ) &
  data19
  warm19 2 eagle3_warm_s16 eagle3 & warm19 3 poss2_warm_s16 poss2 & wait
  plot_tagged _busy eagle3_warm_s16 poss2_warm_s16
  costs19
  pack
  stamp "rerun19 done"
}

all19() {
  gaps19
  sampled19
  heads19
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all19}"; fi  # sourced: its functions only, status 0
