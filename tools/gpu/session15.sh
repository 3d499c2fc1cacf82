#!/usr/bin/env bash
# Ready for the next session, on one 4-GPU machine, with tools/gpu/env.sh sourced (DEEPSPEED=1); SmolLM2 joined
# ($GGUF) and .data/train_prompts.jsonl, train_prompts2.jsonl (tools/prepare_prompts.py) and mt_bench.jsonl carried.
#   distill15 (about 4 minutes): the 11.3k training prompts of Sessions 6-14 (run 1's and run 2's mixes) answered
#          again, greedy, by 4 distill-data workers: the distilled sets of earlier sessions did not survive.
#   heads15 (about 17 minutes): issues 3, 4 and 5 at Session 14's best schedule (32 rows a step, 2,500 steps, lr
#          1e-3: train_head.sh's defaults now) on that data, four drafts trained at once, one per GPU: EAGLE-3
#          (Session 14's best head again: the reference), EAGLE-3 at lr 2e-3 (is 1e-3 the peak?), PosS-1 (issue 4:
#          +5% over the reference?) and Kangaroo l=2 (issue 5: 1.3x?). Then each one benched on the same 80 MT-bench
#          prompts, one after the other on GPU 0 with nothing else running (Session 14 saw plain decoding lose a
#          quarter of its rate on a busy host). Packs after each bench.
#   shapes15 (about 2 minutes, after heads15): the better EAGLE-3 head's chains and trees of 8 shapes, alone.
#   hybrid15 (about 4 minutes): why data.features=hybrid trained 8x slower than online at 32 rows a step
#          (Session 14) when one row a step costs +47%: bench_scale's SmolLM2-shaped random target, 32 rows of
#          1,024 tokens a step, online, hybrid while writing the cache, and hybrid reading it, every phase timed;
#          py-spy samples the reading run's host for 10 s (carry .whl with the py-spy wheel, as in Session 13).
#   all15: distill15, heads15, shapes15, then hybrid15.
set -u
source tools/gpu/session14.sh  # (and session5/6/7/12/13.sh) stamp, pack, wait_for_target, scale_runs, shapes_on
export STEPS=${HEAD_STEPS:-2500}  # session12.sh exported 1000, which train_head.sh would take
export DATA=$WORK/greedy/workers-4  # distill15's merged output (session5.sh set .data/prev/data), train_head.sh's set

train15() {  # GPU $1, label $2, run $3 (methods45.sh's names), then overrides: trained and exported, not benched
  local gpu=$1 label=$2 run=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu WORK=$HOME/work_$label RUNS=$run STAGES=train bash tools/gpu/methods45.sh \
    train.compile=false "$@" > "$RESULTS/train_$label.log" 2>&1
  local dir=$HOME/work_$label/methods45/$run
  mkdir -p "$RESULTS/heads/$label"
  cp "$dir/params.json" "$dir/train/train_summary.json" "$RESULTS/heads/$label/" 2>/dev/null
  cp "$dir"/train/logs/version_*/metrics.csv "$RESULTS/heads/$label/" 2>/dev/null
  stamp "trained $label"
}

bench15() {  # GPU $1, label $2, run $3, tag $4: its chain of 6 and tree (6, 8, 48) on MAX_PROMPTS prompts
  local gpu=$1 label=$2 run=$3 tag=$4
  CUDA_VISIBLE_DEVICES=$gpu WORK=$HOME/work_$label RUNS=$run STAGES=bench BENCH_TAG=$tag \
    bash tools/gpu/methods45.sh > "$RESULTS/bench_$label$tag.log" 2>&1
  local dir=$HOME/work_$label/methods45/$run
  mkdir -p "$RESULTS/heads/$label"  # a head benched without train15 (a carried export) has none yet
  for kind in chain tree; do
    cp "$dir/bench_$kind$tag/bench.json" "$RESULTS/heads/$label/bench_$kind$tag.json" 2>/dev/null
  done
  stamp "benched $label$tag"
}

distill15() {  # one worker a GPU of $1 (default 0,1,2,3), the merged set in $WORK/greedy/workers-<count>
  local gpus=${1:-0,1,2,3} workers
  workers=$(tr ',' '\n' <<< "$gpus" | wc -l)
  mkdir -p "$RESULTS"
  for _ in $(seq 120); do [ -f "$PWD/.data/train_prompts2.jsonl" ] && break; sleep 5; done
  wait_for_target
  stamp "distill15: the training prompts answered again, greedy, $workers workers"
  CUDA_VISIBLE_DEVICES=$gpus timeout 900 python3 tools/bench_distill_scale.py --workers "$workers" --out "$WORK/greedy" \
    -- "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts.jsonl,$PWD/.data/train_prompts2.jsonl]" \
    distill.batch_size=512 distill.shard_size=256 distill.max_new_tokens=256 > "$RESULTS/distill_greedy.log" 2>&1
  cp "$WORK/greedy/workers-$workers/counts.json" "$RESULTS/greedy_counts.json" 2>/dev/null
  cp "$WORK/greedy/bench_distill_scale.json" "$RESULTS/" 2>/dev/null
  tail -4 "$RESULTS/distill_greedy.log"
  pack
}

HEADS15=("0 eagle3_lr1e-3 eagle3" "1 eagle3_lr2e-3 eagle3 train.lr=2e-3" "2 poss1_lr1e-3 poss1"
         "3 kangaroo2_lr1e-3 kangaroo2")

heads15() {
  mkdir -p "$RESULTS"
  stamp "heads15: data $DATA"
  local head args
  for head in "${HEADS15[@]}"; do
    read -r -a args <<< "$head"
    train15 "${args[@]:0:3}" train.val_every_steps=250 "${args[@]:3}" &
  done
  wait
  pack
  for head in "${HEADS15[@]}"; do read -r -a args <<< "$head"; bench15 0 "${args[@]:1:2}" _alone; pack; done
  plot_tagged _alone eagle3_lr1e-3 eagle3_lr2e-3 poss1_lr1e-3 kangaroo2_lr1e-3
  pack
  stamp "heads15 done"
}

shapes15() {  # after heads15: the EAGLE-3 head with the higher tree τ alone, its chains and trees
  local best
  best=$(python3 -c "import json, sys; print(max(sys.argv[1:], key=lambda label: json.load(open(
f'$RESULTS/heads/{label}/bench_tree_alone.json'))['tau']))" eagle3_lr1e-3 eagle3_lr2e-3 2>/dev/null)
  shapes_on 0 "${best:-eagle3_lr1e-3}"
  pack
}

plot_tagged() {  # $1 tag, then head labels: their chain and tree acceptance, one plot per kind
  local tag=$1 kind label labels; shift
  for kind in chain tree; do
    labels=()
    for label in "$@"; do labels+=("$label=$RESULTS/heads/$label/bench_$kind$tag.json"); done
    python3 tools/plot_acceptance.py --out "$RESULTS/acceptance_$kind$tag.png" \
      --title "MT-bench ($MAX_PROMPTS prompts), T=0, $kind$tag" "${labels[@]}" > "$RESULTS/acceptance_$kind$tag.txt" 2>&1
  done
}

hybrid15() {
  mkdir -p "$RESULTS"
  stamp "hybrid15"
  local common=(--config smollm2 --override train.micro_batch_size=32 --timeout 300)  # 8x slower needs the time
  STEPS3=15 scale_runs hybrid_online ddp 1 "${common[@]}" --rows 1024 --override data.features=online
  STEPS3=15 scale_runs hybrid_write ddp 1 "${common[@]}" --rows 1024 --override data.features=hybrid
  STEPS3=40 scale_runs hybrid_read ddp 1 "${common[@]}" --rows 128 --override data.features=hybrid &
  local run=$! pid="" steps=$RESULTS/hybrid_read/work/runs/ddp-1/train/logs/step_times.csv
  for _ in $(seq 120); do  # the training process, once it steps (4 steps write the cache, the rest read it)
    sleep 2
    pid=$(pgrep -f "[p]rofile_train.py" | head -1)
    [ -n "$pid" ] && [ -f "$steps" ] && break
  done
  sleep 10
  if [ -n "$pid" ]; then  # where its host time goes, Python frames (the py-spy wheel in .whl)
    timeout 40 /tmp/site/bin/py-spy record -p "$pid" -d 10 -r 100 -f raw -o "$RESULTS/hybrid_read_pyspy.txt" \
      > "$RESULTS/hybrid_read_pyspy.log" 2>&1
  fi
  wait "$run"
  pack
  stamp "hybrid15 done"
}

all15() {
  distill15
  heads15
  shapes15
  hybrid15
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all15}"; fi  # sourced: its functions only, status 0
