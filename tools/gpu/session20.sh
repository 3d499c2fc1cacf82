#!/usr/bin/env bash
# Ready for the next session, on one machine of 4 GPUs (2 also work, with less), with tools/gpu/env.sh sourced
# (DEEPSPEED=1); SmolLM2 joined ($GGUF), .data/mt_bench.jsonl, Session 16's EAGLE-3 export (.exports/eagle3_s16.tgz),
# Session 18's greedy set (.data/distilled_s18.tgz), the training prompts and .data/base_s19.tgz carried: the
# runtime as Session 19 measured it (`git archive 8ec5258`: the fixed prefill and bench, before the tree's fused
# selection and the draft's attention through the tree-attention kernel).
#   ab20 (about 5 minutes, first, alone on GPU 0): the GPU tests of the kernels and the runtime (the window form of
#        tree_attention and select_tree in CUDA graphs), then Session 16's head on 40 prompts, tree and chain, the
#        current runtime, the base, the current again (one GPU, one after the other: the graphed cycles and
#        tokens/s of the 554 -> 474 launches counted on the CPU), the current with the float32 check.
#   sampled20 (about 5 minutes, 4 GPUs only): sampled19's set (the training prompts at T=0.8), lost in Session 19.
#   heads20: the long EAGLE-3 head on the greedy and the sampled set (GPUs 0,1), Kangaroo l=2 (GPU 2) benched
#        against the honest plain baseline (issue 5); both benched alone at the end.
#   all20: ab20, sampled20, then heads20.
set -u
source tools/gpu/session19.sh  # (and session5-18.sh) stamp, pack, train15, bench15, long18, data19, sampled19, keep19
LONG=eagle3_long20
BASE=$HOME/base_s19

bench20() {  # $1 label, $2 PYTHONPATH's repository, $3 shape flags, $4 float32 prompts: Session 16's head, GPU 0
  local label=$1 root=$2 shape=$3 lossless=$4
  (cd "$root" && PYTHONPATH=/tmp/site:$root CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m specdraft.cli bench \
    "$EAGLE3" $shape --target "$GGUF" --temperature 0 --no-hf --lossless-prompts "$lossless" \
    --prompts "$HOME/repo/.data/mt_bench.jsonl" --max-prompts 40 --out "$RESULTS/ab20/$label" \
    > "$RESULTS/ab20_$label.log" 2>&1)
  stamp "ab20 $label: $(grep -o '"tau".*speedup_vs_plain[^,]*' "$RESULTS/ab20_$label.log" | head -1)"
}

ab20() {
  mkdir -p "$RESULTS/ab20" "$(dirname "$EAGLE3")" "$BASE"
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m pytest -q -m gpu tests/kernels tests/runtime > "$RESULTS/gpu_tests.log" 2>&1
  stamp "GPU tests: $(tail -1 "$RESULTS/gpu_tests.log")"
  for _ in $(seq 120); do [ -f .data/base_s19.tgz ] && [ -f .exports/eagle3_s16.tgz ] && break; sleep 5; done
  tar xzf .data/base_s19.tgz -C "$BASE" && tar xzf .exports/eagle3_s16.tgz -C "$(dirname "$EAGLE3")"
  wait_for_target
  local tree="--depth 6 --topk 8 --budget 48" chain="--chain --depth 6 --exit-threshold 0"
  bench20 tree_new "$PWD" "$tree" 0; bench20 tree_base "$BASE" "$tree" 0; bench20 tree_new2 "$PWD" "$tree" 0
  bench20 chain_new "$PWD" "$chain" 0; bench20 chain_base "$BASE" "$chain" 0
  bench20 tree_lossless "$PWD" "$tree" 10
  pack
}

heads20() {
  data19
  local extra=()
  [ -f "$SAMPLED/counts.json" ] && extra=("train.extra_distilled=[$SAMPLED]")
  if [ "$NGPU" -ge 4 ]; then
    train15 2 kangaroo2_s20 kangaroo2 &
    long18 0,1 wait "${extra[@]}"
  else
    long18 0,1 true "${extra[@]}"
    train15 0 kangaroo2_s20 kangaroo2
  fi
  bench15 0 kangaroo2_s20 kangaroo2 _alone
  costs19
  pack
  stamp "heads20 done"
}

all20() {
  ab20
  sampled19
  heads20
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all20}"; fi  # sourced: its functions only, status 0
