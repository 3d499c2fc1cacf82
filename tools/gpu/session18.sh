#!/usr/bin/env bash
# Ready for the next session, on one machine of 2 or more GPUs (Session 17's nvidia-h100-x4 was not lent then:
# only up to 2 GPUs), with tools/gpu/env.sh sourced (DEEPSPEED=1); SmolLM2 joined ($GGUF), .data/train_prompts.jsonl,
# train_prompts2.jsonl and mt_bench.jsonl carried, and Session 16's EAGLE-3 export as .exports/eagle3_s16.tgz.
# Every function uses the GPUs there are ($NGPU); times below are for 2 H100s.
#   runtime18 (about 4.5 minutes, first, alone): Session 17's runtime17 without its A/B of the chain's trims: the
#          kept head benched on all 80 prompts with the plain step's graph and the host's issue times, traced
#          (the device's kernel time per plain step and per cycle against the wall clock) and sampled by py-spy.
#          Where the 0.4 ms a token beyond the graphs goes (Session 16) decides issue 3's next step.
#   distill18 (about 9 minutes on 2 GPUs, 5.5 on 4): the training prompts answered again, greedy, one worker a GPU;
#          keep_data then packs the merged set in 15 MB parts for the last call's $OUT, so that no later session
#          distills it again.
#   long18 (about 9 minutes on 2 GPUs): the EAGLE-3 head at twice (on 4 GPUs, four times) Session 16's samples:
#          32 rows a GPU a step, data-parallel, 2,500 steps, lr 1e-3. Session 16's held-out τ_sim still rose at
#          its schedule's end (3.22, 3.27, 3.29 at steps 2,000, 2,250, 2,500) while training τ_sim reached 4.1:
#          does more of the same data raise τ (issues 3-5 all wait on τ)? Then benched alone (80 prompts, chain 6
#          and tree 6, 8, 48), beside Session 16's head in one plot.
#   poss18 (after long18, if time is left): PosS-2 from the long head (method.init_from), 1,000 steps at lr 3e-4
#          on one GPU, then its τ (issue 4).
#   heads18 (4 GPUs or more; else long18 then poss18): long18 on GPUs 0,1 (twice Session 16's samples), beside it
#          PosS-2 from Session 16's head (the kept export) on GPU 2, then its τ (issue 4: against the head it
#          started from, benched by runtime18), and Kangaroo l=2 on GPU 3, then its η sweep on 10 prompts
#          (issue 5; a busy host: its speedups are indicative). The long head's bench waits for both, alone.
#   all18: runtime18, distill18 (gpu16, the runtime's GPU tests, beside it), heads18.
set -u
source tools/gpu/session17.sh  # (and session5-16.sh) stamp, pack, distill15, train15, bench15, plot_tagged, runtime17
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
ALL_GPUS=$(seq -s, 0 $((NGPU > 0 ? NGPU - 1 : 0)))
LONG=eagle3_long18
export DATA=$WORK/greedy/workers-$NGPU  # distill18's merged output, train15's data

runtime18() {  # runtime17 without ab17
  ab17() { stamp "ab17 skipped (session18.sh)"; }
  runtime17
}

distill18() {  # distill15 on every GPU, then the set tarred for keep_data
  distill15 "$ALL_GPUS"
  tar czf "$HOME/distilled.tgz" -C "$WORK/greedy" "workers-$NGPU" && stamp "distilled set: $(du -h "$HOME/distilled.tgz")"
}

keep_data() {  # the distilled set in 15 MB parts under $1 (a device call's $OUT; join: cat distilled.tgz.part* >
  # distilled.tgz, then tar xzf it into .data/ and name .data/workers-N as DATA)
  split -b 15M -d "$HOME/distilled.tgz" "$1/distilled.tgz.part"
}

long18() {  # $1: its GPUs (default all), $2: a command to wait for before the bench (default none), then overrides
  local gpus=${1:-$ALL_GPUS} before=${2:-true} count
  shift $(($# < 2 ? $# : 2))
  count=$(tr ',' '\n' <<< "$gpus" | wc -l)
  mkdir -p "$RESULTS"
  stamp "long18: EAGLE-3 on GPUs $gpus, 32 rows each a step, data $DATA"
  train15 "$gpus" "$LONG" eagle3 "train.devices=$count" train.strategy=ddp "$@"
  pack
  $before
  bench15 0 "$LONG" eagle3 _alone
  plot_tagged _alone eagle3_s16 "$LONG"  # runtime18 benched Session 16's head (the kept export) the same way
  pack
}

poss18() {
  local init=method.init_from=$HOME/work_$LONG/methods45/eagle3/export
  train15 0 poss2_from_long poss2 "$init" train.max_steps=1000 train.warmup_steps=50 train.lr=3e-4
  bench15 0 poss2_from_long poss2 _alone
  plot_tagged _alone "$LONG" poss2_from_long
  pack
  stamp "poss18 done"
}

heads18() {
  if [ "$NGPU" -lt 4 ]; then long18; poss18; return; fi
  local init=method.init_from=$EAGLE3
  ( train15 2 poss2_from_s16 poss2 "$init" train.max_steps=1000 train.warmup_steps=50 train.lr=3e-4
    bench15 2 poss2_from_s16 poss2 _busy ) &
  ( train15 3 kangaroo2_s18 kangaroo2
    stamp "kangaroo sweep (busy host)"
    CUDA_VISIBLE_DEVICES=3 timeout 300 python3 tools/bench_kangaroo.py "$HOME/work_kangaroo2_s18/methods45/kangaroo2/export" \
      --eta 0 0.3 0.5 0.7 --depth 6 --prompts "$PWD/.data/mt_bench.jsonl" --max-prompts 10 \
      --out "$RESULTS/kangaroo_sweep" > "$RESULTS/kangaroo_sweep.log" 2>&1
    stamp "kangaroo sweep done" ) &
  long18 0,1 wait  # the long head's bench waits for the two above: alone
  cp "$RESULTS/heads/eagle3_s16/bench_tree_alone.json" "$RESULTS/heads/eagle3_s16/bench_tree_busy.json" 2>/dev/null
  cp "$RESULTS/heads/eagle3_s16/bench_chain_alone.json" "$RESULTS/heads/eagle3_s16/bench_chain_busy.json" 2>/dev/null
  plot_tagged _busy eagle3_s16 poss2_from_s16  # τ only: PosS against the head it started from
  pack
  stamp "heads18 done"
}

all18() {
  runtime18
  gpu16 &
  distill18
  wait
  heads18
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all18}"; fi  # sourced: its functions only, status 0
