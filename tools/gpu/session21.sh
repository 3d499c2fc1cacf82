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
#   all21: kernels21, then ab21.
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

all21() {
  kernels21
  ab21
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all21}"; fi  # sourced: its functions only, status 0
