#!/usr/bin/env bash
# Ready for the next session, on one GPU (1xH100 or H200), with tools/gpu/env.sh sourced; SmolLM2 joined ($GGUF),
# .data/mt_bench.jsonl, Session 20's long head (.exports/long_export.tgz.part00: greedy + sampled answers, τ 3.71)
# and .data/base_s20.tgz carried (`git archive b86f785 specdraft`: Session 20's measured runtime, its prefill eager).
#   kernels21 (first): the GPU tests of the kernels and the runtime (the prefill's graphs among them); on a failure
#        of the prefill's test every bench runs with the eager prefill's base instead of the current code.
#   ab21 (about 6 minutes, alone): the long head on all 80 MT-bench prompts, tree (5, 8, 40) and chain of 6: the
#        current runtime (the prefill in CUDA graphs per padded length; 8-13 launches fewer a cycle: the frontier's
#        own slots, the root column's first_column, the commit's path index), the base, the current again, one after
#        another on one GPU; then the current with the float32 check. Session 20 measured 2.17x (tree) with the
#        eager prefill, 2.45x inside the graphs alone.
#   kangaroo21 (about 8 minutes, after ab21): issue 5 measured again with the runtime of today (Session 16's 1.20x
#        was over the plain loop of then, cuDNN's planning in it): a Kangaroo l=2 adapter trained on Session 18's
#        greedy set (.data/distilled_s18.tgz carried; 2,500 steps, about 3 minutes), then benched alone on the
#        80 prompts: its chain of 6, chains of 3 and 4 with the confidence exit (eta sweep), trees (4, 4, 16) and
#        (5, 8, 40), each against plain decoding in the same run.
#   all21: kernels21, then ab21, then kangaroo21.
set -u
source tools/gpu/session20.sh  # (and session5-19.sh) stamp, pack, wait_for_target
BASE=$HOME/base_s20
LONG_EXPORT=$HOME/long/export
CURRENT=$PWD

kernels21() {
  mkdir -p "$RESULTS"
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -m gpu tests/kernels tests/runtime \
    > "$RESULTS/gpu_tests.log" 2>&1
  stamp "GPU tests: $(tail -1 "$RESULTS/gpu_tests.log")"
  grep -q "^FAILED .*prefill" "$RESULTS/gpu_tests.log" && CURRENT=$BASE && stamp "prefill graphs failed: base only"
}

bench21() {  # $1 label, $2 repository, $3 shape flags, $4 float32 prompts: the long head, GPU 0
  local label=$1 root=$2 shape=$3 lossless=$4
  (cd "$root" && PYTHONPATH=/tmp/site:$root CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m specdraft.cli bench \
    "$LONG_EXPORT" $shape --target "$GGUF" --temperature 0 --no-hf --lossless-prompts "$lossless" \
    --prompts "$HOME/repo/.data/mt_bench.jsonl" --max-prompts 80 --out "$RESULTS/ab21/$label" \
    > "$RESULTS/ab21_$label.log" 2>&1)
  stamp "ab21 $label: $(grep -o '"tau".*speedup_vs_plain[^,]*' "$RESULTS/ab21_$label.log" | head -1)"
}

ab21() {
  mkdir -p "$RESULTS/ab21" "$BASE" "$(dirname "$LONG_EXPORT")"
  for _ in $(seq 120); do [ -f .data/base_s20.tgz ] && [ -f .exports/long_export.tgz.part00 ] && break; sleep 5; done
  [ -d "$BASE/specdraft" ] || tar xzf .data/base_s20.tgz -C "$BASE"
  [ -d "$LONG_EXPORT" ] || tar xzf .exports/long_export.tgz.part00 -C "$(dirname "$LONG_EXPORT")"
  wait_for_target
  local tree="--depth 5 --topk 8 --budget 40" chain="--chain --depth 6 --exit-threshold 0"
  bench21 tree_new "$CURRENT" "$tree" 0; bench21 tree_base "$BASE" "$tree" 0; bench21 tree_new2 "$CURRENT" "$tree" 0
  bench21 chain_new "$CURRENT" "$chain" 0; bench21 chain_base "$BASE" "$chain" 0
  bench21 tree_lossless "$CURRENT" "$tree" 10
  pack
  stamp "ab21 done"
}

kangaroo21() {
  mkdir -p "$RESULTS/kangaroo21"
  for _ in $(seq 120); do [ -f .data/distilled_s18.tgz ] && break; sleep 5; done
  [ -d "$DATA" ] || { mkdir -p "$WORK/greedy" && tar xzf .data/distilled_s18.tgz -C "$WORK/greedy"; }
  stamp "kangaroo21: data $(du -sh "$DATA" | cut -f1)"
  train15 0 kangaroo2_s21 kangaroo2
  local export=$HOME/work_kangaroo2_s21/methods45/kangaroo2/export shape label
  for shape in "chain6:--chain --depth 6 --exit-threshold 0" "tree4_4_16:--depth 4 --topk 4 --budget 16" \
               "tree5_8_40:--depth 5 --topk 8 --budget 40"; do
    label=${shape%%:*}
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m specdraft.cli bench "$export" ${shape#*:} --target "$GGUF" \
      --temperature 0 --no-hf --lossless-prompts 5 --prompts .data/mt_bench.jsonl --max-prompts 80 \
      --out "$RESULTS/kangaroo21/$label" > "$RESULTS/kangaroo21_$label.log" 2>&1
    stamp "kangaroo21 $label: $(grep -o '"tau".*speedup_vs_plain[^,]*' "$RESULTS/kangaroo21_$label.log" | head -1)"
    pack
  done
  for depth in 3 4; do
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 tools/bench_kangaroo.py "$export" --eta 0 0.2 0.4 --depth $depth \
      --prompts .data/mt_bench.jsonl --max-prompts 80 --out "$RESULTS/kangaroo21/sweep_depth$depth" \
      > "$RESULTS/kangaroo21_sweep_depth$depth.log" 2>&1
    stamp "kangaroo21 sweep depth $depth: $(grep -c '^| 2 ' "$RESULTS/kangaroo21_sweep_depth$depth.log") rows"
    pack
  done
  stamp "kangaroo21 done"
}

all21() {
  kernels21
  ab21
  kangaroo21
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all21}"; fi  # sourced: its functions only, status 0
