#!/usr/bin/env bash
# Session 22's second machine (one GPU), with tools/gpu/env.sh sourced; SmolLM2 joined ($GGUF), .data/mt_bench.jsonl,
# Session 20's long head (.exports/long_export.tgz.part00) and .data/base_s22.tgz carried (`git archive 02fd3a7
# specdraft`: the runtime measured by session22.sh, 2.48x plain on the (5, 8, 40) tree).
#   ab23 (about 7 minutes, alone): the long head on the 80 prompts with no cycle queued past the 256th token (the
#        base ran one more cycle at the end of each answer, 55 of 80 prompts): tree (5, 8, 40) current with
#        Hugging Face generate on the first 10 prompts (issue 3's three rates in one run), base, current again;
#        chain of 6 current, base.
# Session 23 (one GPU), carried besides: .data/base_s23.tgz (`git archive d80713f specdraft`: the runtime measured
# at 2.53x in ab23), .data/distilled_s18.tgz and .data/sampled.tgz.part00 (the long head's greedy and sampled sets),
# .data/kexports_s22.tgz (Session 22's adapters, trained on the greedy set alone).
#   train23 (first, beside kernels22): Kangaroo l=2 on the greedy and the sampled set, the long head's data, with
#        Session 22's schedule (2,500 steps).
#   final23 (alone, about 8 minutes): the runtime as it stands against d80713f: tree (5, 8, 40) current with Hugging
#        Face generate on the first 10 prompts, base, current again with the float32 check on 10 prompts; chain of 6
#        current, base.
#   kangaroo23 (alone, about 4 minutes): the two l=2 adapters (both sets; greedy alone): each one's tree (3, 4, 12)
#        with the float32 check on 5 prompts, then both chains of 3 at eta 0 (tools/bench_kangaroo.py).
#   all23: train23 and kernels22 at once, then final23 and kangaroo23.
set -u
source tools/gpu/session22.sh  # (and session5-21.sh) stamp, pack, unpack_ab, bench22
BASE=$HOME/base_s22 AB=ab23  # final23 sets BASE=$HOME/base_s23

ab23() {
  unpack_ab .data/base_s22.tgz || return
  local tree="--depth 5 --topk 8 --budget 40" chain="--chain --depth 6 --exit-threshold 0" here=$PWD
  bench22 tree_new_hf "$here" "$LONG_EXPORT" "$tree --hf-prompts 10" 0
  bench22 tree_base "$BASE" "$LONG_EXPORT" "$tree" 0; bench22 tree_new2 "$here" "$LONG_EXPORT" "$tree" 0
  bench22 chain_new "$here" "$LONG_EXPORT" "$chain" 0; bench22 chain_base "$BASE" "$LONG_EXPORT" "$chain" 0
  pack
  stamp "ab23 done"
}

train23() {
  wait_for .data/distilled_s18.tgz && wait_for .data/sampled.tgz.part00 || return
  [ -d "$DATA" ] || { mkdir -p "$WORK/greedy" && tar xzf .data/distilled_s18.tgz -C "$WORK/greedy"; }
  [ -d "$SAMPLED" ] || { mkdir -p "$WORK/sampled" && tar xzf .data/sampled.tgz.part00 -C "$WORK/sampled"; }
  wait_for_target
  train15 0 kangaroo2_both23 kangaroo2 "train.extra_distilled=[$SAMPLED]"
  pack
  stamp "train23 done"
}

final23() {
  AB=final23 BASE=$HOME/base_s23
  unpack_ab .data/base_s23.tgz || return
  local tree="--depth 5 --topk 8 --budget 40" chain="--chain --depth 6 --exit-threshold 0" here=$PWD
  bench22 tree_new_hf "$here" "$LONG_EXPORT" "$tree --hf-prompts 10" 0
  bench22 tree_base "$BASE" "$LONG_EXPORT" "$tree" 0; bench22 tree_new2 "$here" "$LONG_EXPORT" "$tree" 10
  bench22 chain_new "$here" "$LONG_EXPORT" "$chain" 0; bench22 chain_base "$BASE" "$LONG_EXPORT" "$chain" 0
  pack
  stamp "final23 done"
}

kangaroo23() {
  AB=kangaroo23
  mkdir -p "$RESULTS/$AB"
  wait_for .data/kexports_s22.tgz && tar xzf .data/kexports_s22.tgz -C "$HOME"
  local both=$HOME/work_kangaroo2_both23/methods45/kangaroo2/export
  local greedy=$HOME/work_kangaroo2_s22/methods45/kangaroo2/export label export exports=()
  for label in both greedy; do
    export=${!label}
    [ -f "$export/config.json" ] || { stamp "kangaroo23 $label: no export"; continue; }
    exports+=("$export")
    bench22 "${label}_tree_3_4_12" "$PWD" "$export" "--depth 3 --topk 4 --budget 12" 5
    pack
  done
  [ ${#exports[@]} -gt 0 ] || return
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 tools/bench_kangaroo.py "${exports[@]}" --eta 0 --depth 3 \
    --prompts .data/mt_bench.jsonl --max-prompts 80 --out "$RESULTS/$AB/chains" > "$RESULTS/${AB}_chains.log" 2>&1
  stamp "kangaroo23 chains: $(grep -c '^| ' "$RESULTS/${AB}_chains.log") table lines"
  pack
  stamp "kangaroo23 done"
}

all23() {
  train23 &
  local training=$!
  kernels22
  wait "$training"
  final23
  kangaroo23
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all23}"; fi  # sourced: its functions only, status 0
