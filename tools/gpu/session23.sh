#!/usr/bin/env bash
# Session 22's second machine (one GPU), with tools/gpu/env.sh sourced; SmolLM2 joined ($GGUF), .data/mt_bench.jsonl,
# Session 20's long head (.exports/long_export.tgz.part00) and .data/base_s22.tgz carried (`git archive 02fd3a7
# specdraft`: the runtime measured by session22.sh, 2.48x plain on the (5, 8, 40) tree).
#   ab23 (about 7 minutes, alone): the long head on the 80 prompts with no cycle queued past the 256th token (the
#        base ran one more cycle at the end of each answer, 55 of 80 prompts): tree (5, 8, 40) current with
#        Hugging Face generate on the first 10 prompts (issue 3's three rates in one run), base, current again;
#        chain of 6 current, base.
# Session 23 ran final23's commands by hand on one H100 (its last 5 minutes of device time), in three calls: part a
# with .whl and .data/base_s23.tgz (`git archive d80713f specdraft`: the runtime ab23 measured), part b, then the
# long head and the benches (tools/gpu/README.md, "Session 23's calls as run").
#   final23 (about 3 minutes): the (5, 8, 40) tree as the runtime stands, with the float32 check on 10 prompts, then
#        the base; then the GPU tests of the tree's selection and verification kernels.
set -u
source tools/gpu/session22.sh  # (and session5-21.sh) stamp, pack, unpack_ab, bench22
BASE=$HOME/base_s22 AB=ab23

ab23() {
  unpack_ab .data/base_s22.tgz || return
  local tree="--depth 5 --topk 8 --budget 40" chain="--chain --depth 6 --exit-threshold 0" here=$PWD
  bench22 tree_new_hf "$here" "$LONG_EXPORT" "$tree --hf-prompts 10" 0
  bench22 tree_base "$BASE" "$LONG_EXPORT" "$tree" 0; bench22 tree_new2 "$here" "$LONG_EXPORT" "$tree" 0
  bench22 chain_new "$here" "$LONG_EXPORT" "$chain" 0; bench22 chain_base "$BASE" "$LONG_EXPORT" "$chain" 0
  pack
  stamp "ab23 done"
}

final23() {
  AB=final23 BASE=$HOME/base_s23
  unpack_ab .data/base_s23.tgz || return
  bench22 tree_final "$PWD" "$LONG_EXPORT" "--depth 5 --topk 8 --budget 40" 10
  bench22 tree_base "$BASE" "$LONG_EXPORT" "--depth 5 --topk 8 --budget 40" 0
  CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -m gpu tests/kernels -k "select or verify" \
    > "$RESULTS/gpu_tests.log" 2>&1
  pack
  stamp "final23 done: $(tail -1 "$RESULTS/gpu_tests.log")"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-ab23}"; fi  # sourced: its functions only, status 0
