#!/usr/bin/env bash
# Session 22's second machine (one GPU), with tools/gpu/env.sh sourced; SmolLM2 joined ($GGUF), .data/mt_bench.jsonl,
# Session 20's long head (.exports/long_export.tgz.part00) and .data/base_s22.tgz carried (`git archive 02fd3a7
# specdraft`: the runtime measured by session22.sh, 2.48x plain on the (5, 8, 40) tree).
#   ab23 (about 7 minutes, alone): the long head on the 80 prompts with no cycle queued past the 256th token (the
#        base ran one more cycle at the end of each answer, 55 of 80 prompts): tree (5, 8, 40) current with
#        Hugging Face generate on the first 10 prompts (issue 3's three rates in one run), base, current again;
#        chain of 6 current, base.
set -u
source tools/gpu/session22.sh  # (and session5-21.sh) stamp, pack, wait_for, wait_for_target
BASE=$HOME/base_s22

bench23() {  # $1 label, $2 repository, $3 shape flags: one bench of the long head on GPU 0
  local label=$1 root=$2 shape=$3 hf=--no-hf
  [[ $shape == *--hf-prompts* ]] && hf=""
  (cd "$root" && PYTHONPATH=/tmp/site:$root CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m specdraft.cli bench \
    "$LONG_EXPORT" $shape --target "$GGUF" --temperature 0 $hf --lossless-prompts 0 \
    --prompts "$HOME/repo/.data/mt_bench.jsonl" --max-prompts 80 --out "$RESULTS/ab23/$label" \
    > "$RESULTS/ab23_$label.log" 2>&1)
  stamp "ab23 $label: $(grep -o '"tau".*speedup_vs_plain[^,]*' "$RESULTS/ab23_$label.log" | head -1)"
  pack
}

ab23() {
  mkdir -p "$RESULTS/ab23" "$BASE" "$(dirname "$LONG_EXPORT")"
  wait_for .data/base_s22.tgz && wait_for .exports/long_export.tgz.part00 || return
  [ -d "$BASE/specdraft" ] || tar xzf .data/base_s22.tgz -C "$BASE"
  [ -d "$LONG_EXPORT" ] || tar xzf .exports/long_export.tgz.part00 -C "$(dirname "$LONG_EXPORT")"
  wait_for_target
  local tree="--depth 5 --topk 8 --budget 40" chain="--chain --depth 6 --exit-threshold 0" here=$PWD
  bench23 tree_new_hf "$here" "$tree --hf-prompts 10"; bench23 tree_base "$BASE" "$tree"
  bench23 tree_new2 "$here" "$tree"; bench23 chain_new "$here" "$chain"; bench23 chain_base "$BASE" "$chain"
  stamp "ab23 done"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-ab23}"; fi  # sourced: its functions only, status 0
