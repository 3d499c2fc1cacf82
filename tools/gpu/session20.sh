#!/usr/bin/env bash
# Ready for the next session, on one machine of 4 GPUs, with tools/gpu/env.sh sourced (DEEPSPEED=1); SmolLM2 joined
# ($GGUF), .data/mt_bench.jsonl, Session 16's EAGLE-3 export (.exports/eagle3_s16.tgz), Session 18's greedy set
# (.data/distilled_s18.tgz), the training prompts and .data/base_s19.tgz carried: the runtime as Session 19
# measured it (`git archive 8ec5258`: the fixed prefill and bench, before the tree's fused selection, the draft's
# attention through the tree-attention kernel, its input in one launch and its rope's offsets).
#   kernels20 (GPU 0, first): the GPU tests of the kernels and the runtime; an op whose test fails runs its
#        reference in every later run (SPECDRAFT_KERNELS=reference:OP,...).
#   ab20 (GPU 0, about 5 minutes): Session 16's head on 30 prompts, tree and chain: the current runtime, the
#        base, the current again, one after another on one GPU (the graphed cycles and tokens/s of the launches
#        cut since the base); then the current with the float32 check.
#   sweep20 (GPU 1, beside ab20): the tree's shape (depth, top-k, budget) on the same head, 30 prompts each; each
#        run's speedup is over its own plain decoding.
#   sampled20 (GPUs 2 and 3, beside them): the training prompts answered at T=0.8, two workers (lost in Session 19).
#   heads20 (4 GPUs, after them): the long EAGLE-3 head on the greedy and the sampled set, 4 x 32 rows a step,
#        2,000 steps, benched alone; then every bench's loop costs (tools/loop_costs.py).
#   all20: kernels20, then ab20 with sweep20 and sampled20 beside it, then heads20. Kangaroo is not in it.
set -u
source tools/gpu/session19.sh  # (and session5-18.sh) stamp, pack, train15, bench15, long18, data19, costs19
LONG=eagle3_long20
BASE=$HOME/base_s19
SAMPLED=$WORK/sampled/workers-2
TREE="--depth 6 --topk 8 --budget 48"
CHAIN="--chain --depth 6 --exit-threshold 0"

kernels20() {
  mkdir -p "$RESULTS"
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -m gpu tests/kernels tests/runtime \
    > "$RESULTS/gpu_tests.log" 2>&1
  local failed=() op
  for op in draft_input rope_cache tree_attention tree_select tree_frontier; do
    grep -q "^FAILED .*$op" "$RESULTS/gpu_tests.log" && failed+=("$op")
  done
  [ ${#failed[@]} -gt 0 ] && export SPECDRAFT_KERNELS="reference:$(IFS=,; echo "${failed[*]}")"
  stamp "GPU tests: $(tail -1 "$RESULTS/gpu_tests.log"); SPECDRAFT_KERNELS=${SPECDRAFT_KERNELS:-auto}"
}

bench20() {  # $1 label, $2 PYTHONPATH's repository, $3 shape flags, $4 float32 prompts, $5 GPU: Session 16's head
  local label=$1 root=$2 shape=$3 lossless=$4 gpu=${5:-0}
  (cd "$root" && PYTHONPATH=/tmp/site:$root CUDA_VISIBLE_DEVICES=$gpu timeout 200 python3 -m specdraft.cli bench \
    "$EAGLE3" $shape --target "$GGUF" --temperature 0 --no-hf --lossless-prompts "$lossless" \
    --prompts "$HOME/repo/.data/mt_bench.jsonl" --max-prompts 30 --out "$RESULTS/ab20/$label" \
    > "$RESULTS/ab20_$label.log" 2>&1)
  stamp "ab20 $label: $(grep -o '"tau".*speedup_vs_plain[^,]*' "$RESULTS/ab20_$label.log" | head -1)"
}

head16() {  # Session 16's export and the base revision, unpacked once they are carried (the third call)
  mkdir -p "$RESULTS/ab20" "$(dirname "$EAGLE3")" "$BASE"
  for _ in $(seq 120); do [ -f .data/base_s19.tgz ] && [ -f .exports/eagle3_s16.tgz ] && break; sleep 5; done
  [ -d "$EAGLE3" ] || tar xzf .exports/eagle3_s16.tgz -C "$(dirname "$EAGLE3")"
  [ -d "$BASE/specdraft" ] || tar xzf .data/base_s19.tgz -C "$BASE"
  wait_for_target
}

ab20() {
  head16
  bench20 tree_new "$PWD" "$TREE" 0; bench20 tree_base "$BASE" "$TREE" 0; bench20 tree_new2 "$PWD" "$TREE" 0
  bench20 chain_new "$PWD" "$CHAIN" 0; bench20 chain_base "$BASE" "$CHAIN" 0
  bench20 tree_lossless "$PWD" "$TREE" 10
}

sweep20() {
  head16
  local shape
  for shape in 6,8,48 7,8,64 8,8,64 6,10,64 5,8,40; do
    IFS=, read -r depth topk budget <<< "$shape"
    bench20 "sweep_$depth-$topk-$budget" "$PWD" "--depth $depth --topk $topk --budget $budget" 0 1
  done
}

sampled20() {
  for _ in $(seq 120); do [ -f "$PWD/.data/train_prompts2.jsonl" ] && break; sleep 5; done
  wait_for_target
  stamp "sampled20: the training prompts answered again, T=0.8, 2 workers (GPUs 2, 3)"
  CUDA_VISIBLE_DEVICES=2,3 timeout 900 python3 tools/bench_distill_scale.py --workers 2 --out "$WORK/sampled" \
    -- "target.path=$GGUF" "data.prompts=[$PWD/.data/train_prompts.jsonl,$PWD/.data/train_prompts2.jsonl]" \
    distill.batch_size=512 distill.shard_size=256 distill.max_new_tokens=256 distill.temperature=0.8 distill.seed=1 \
    > "$RESULTS/distill_sampled.log" 2>&1
  cp "$SAMPLED/counts.json" "$RESULTS/sampled_counts.json" 2>/dev/null
  stamp "sampled set: $(tr -d '\n ' < "$RESULTS/sampled_counts.json" 2>/dev/null)"
}

heads20() {
  data19
  local extra=()
  [ -f "$SAMPLED/counts.json" ] && extra=("train.extra_distilled=[$SAMPLED]")
  long18 "$ALL_GPUS" true train.max_steps=2000 "${extra[@]}"
  costs19
  pack
  stamp "heads20 done"
}

keep20() {  # the long head's export and the sampled set, in 15 MB parts under $1 (the last call's $OUT)
  tar czf "$HOME/long_export.tgz" -C "$HOME/work_$LONG/methods45/eagle3" export \
    && split -b 15M -d "$HOME/long_export.tgz" "$1/long_export.tgz.part"
  [ -d "$SAMPLED" ] && tar czf "$HOME/sampled.tgz" -C "$(dirname "$SAMPLED")" "$(basename "$SAMPLED")" \
    && split -b 15M -d "$HOME/sampled.tgz" "$1/sampled.tgz.part"
}

all20() {
  kernels20
  sweep20 > "$RESULTS/sweep20.log" 2>&1 &
  local sweep=$!
  sampled20 > "$RESULTS/sampled20.log" 2>&1 &
  local sampled=$!
  ab20
  pack
  wait "$sweep" "$sampled"
  pack
  heads20
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all20}"; fi  # sourced: its functions only, status 0
