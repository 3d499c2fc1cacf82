#!/usr/bin/env bash
# Ready for the next session, on one machine of 1 or 4 GPUs (4 train the adapters at once), with tools/gpu/env.sh
# sourced; SmolLM2 joined ($GGUF), .data/mt_bench.jsonl, Session 20's long head (.exports/long_export.tgz.part00),
# Session 18's greedy set (.data/distilled_s18.tgz) and .data/base_s21.tgz carried (`git archive aa51e78
# specdraft`: the runtime Session 21 measured, 2.46x plain on the (5, 8, 40) tree).
#   train22 (first, beside kernels22): Kangaroo adapters at exit layers l = 1, 2, 3, 4 on the greedy set (2,500
#        steps each, Session 21's l=2 schedule; one per GPU on 4 GPUs, else two at a time on GPU 0).
#   kernels22 (GPU 0): the GPU tests of the kernels and the runtime (commit_path among them); on its failure
#        every run takes its reference (SPECDRAFT_KERNELS=reference:path_commit).
#   ab22 (GPU 0, alone, about 9 minutes): the long head on the 80 prompts: the commit in one launch and the
#        ingest's three launches fewer (17 a cycle in all), against the base: tree (5, 8, 40) current, base,
#        current; chain of 6 current, base; then the budget alone grown, (5, 8, 48) and (5, 8, 64) (the verify's
#        rows cost little next to the draft's depth), the larger with the float32 check; last, the (5, 8, 40) tree
#        with Hugging Face generate on the first 10 prompts (`--hf-prompts 10`: its speedups on those prompts).
#   ops22 (GPU 0, alone, about a minute): tools/bench_kernels.py, every kernel against its reference.
#   kangaroo22 (GPU 0, alone, about 7 minutes): each adapter's tree (3, 4, 12) (Session 21's best, 1.47x), then
#        each one's chain of 3 at eta 0 and all of them with DEL choosing the exit (tools/bench_kangaroo.py; Session
#        21 swept eta at l=2).
#   all22: train22 and kernels22 at once, then ab22, ops22, kangaroo22.
set -u
source tools/gpu/session21.sh  # (and session5-20.sh) stamp, pack, wait_for_target, train15
BASE=$HOME/base_s21
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
AB=ab22  # the benches' folder and log prefix under $RESULTS
read -r -a KANGAROO_LAYERS <<< "${KANGAROO_LAYERS:-1 2 3 4}"  # on one GPU: KANGAROO_LAYERS="2 4"

wait_for() {  # a carried file $1 (the third call brings them)
  for _ in $(seq 120); do [ -f "$1" ] && return 0; sleep 5; done
  stamp "missing $1"
  return 1
}

kernels22() {
  mkdir -p "$RESULTS"
  CUDA_VISIBLE_DEVICES=0 timeout 360 python3 -m pytest -q -m gpu tests/kernels tests/runtime \
    > "$RESULTS/gpu_tests.log" 2>&1
  grep -q "^FAILED .*commit_path" "$RESULTS/gpu_tests.log" && export SPECDRAFT_KERNELS=reference:path_commit
  stamp "GPU tests: $(tail -1 "$RESULTS/gpu_tests.log"); SPECDRAFT_KERNELS=${SPECDRAFT_KERNELS:-auto}"
}

train22() {  # the adapters, trained and exported (train15: methods45.sh's kangaroo<l> runs)
  wait_for .data/distilled_s18.tgz || return
  [ -d "$DATA" ] || { mkdir -p "$WORK/greedy" && tar xzf .data/distilled_s18.tgz -C "$WORK/greedy"; }
  wait_for_target
  local layer gpu=0 pids=()
  for layer in "${KANGAROO_LAYERS[@]}"; do
    train15 $((gpu % NGPU)) "kangaroo${layer}_s22" "kangaroo$layer" & pids+=($!)
    gpu=$((gpu + 1))
    if [ "$NGPU" -lt 4 ] && [ ${#pids[@]} -ge 2 ]; then wait "${pids[@]}"; pids=(); fi
  done
  wait "${pids[@]}"
  pack
  stamp "train22 done"
}

bench22() {  # $1 label, $2 repository, $3 export, $4 shape flags, $5 float32 prompts: one bench on GPU 0
  local label=$1 root=$2 export=$3 shape=$4 lossless=$5 hf=--no-hf
  [[ $shape == *--hf-prompts* ]] && hf=""  # Hugging Face generate on the prompts it names
  (cd "$root" && PYTHONPATH=/tmp/site:$root CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m specdraft.cli bench \
    "$export" $shape --target "$GGUF" --temperature 0 $hf --lossless-prompts "$lossless" \
    --prompts "$HOME/repo/.data/mt_bench.jsonl" --max-prompts 80 --out "$RESULTS/$AB/$label" \
    > "$RESULTS/${AB}_$label.log" 2>&1)
  stamp "$AB $label: $(grep -o '"tau".*speedup_vs_plain[^,]*' "$RESULTS/${AB}_$label.log" | head -1)"
}

unpack_ab() {  # $1: the base's archive (a carried file): it and the long head unpacked, the target joined
  mkdir -p "$RESULTS/$AB" "$BASE" "$(dirname "$LONG_EXPORT")"
  wait_for "$1" && wait_for .exports/long_export.tgz.part00 || return
  [ -d "$BASE/specdraft" ] || tar xzf "$1" -C "$BASE"
  [ -d "$LONG_EXPORT" ] || tar xzf .exports/long_export.tgz.part00 -C "$(dirname "$LONG_EXPORT")"
  wait_for_target
}

ab22() {
  unpack_ab .data/base_s21.tgz || return
  local tree="--depth 5 --topk 8 --budget 40" chain="--chain --depth 6 --exit-threshold 0" here=$PWD
  bench22 tree_new "$here" "$LONG_EXPORT" "$tree" 0; bench22 tree_base "$BASE" "$LONG_EXPORT" "$tree" 0
  bench22 tree_new2 "$here" "$LONG_EXPORT" "$tree" 0
  bench22 chain_new "$here" "$LONG_EXPORT" "$chain" 0; bench22 chain_base "$BASE" "$LONG_EXPORT" "$chain" 0
  bench22 tree_5_8_48 "$here" "$LONG_EXPORT" "--depth 5 --topk 8 --budget 48" 0
  bench22 tree_5_8_64 "$here" "$LONG_EXPORT" "--depth 5 --topk 8 --budget 64" 10
  bench22 tree_hf "$here" "$LONG_EXPORT" "$tree --hf-prompts 10" 0  # issue 3's three rates in one run
  pack
  stamp "ab22 done"
}

ops22() {
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 tools/bench_kernels.py --out "$RESULTS/bench_kernels.json" \
    > "$RESULTS/bench_kernels.log" 2>&1
  stamp "ops22: $(grep -c . "$RESULTS/bench_kernels.log") lines"
  pack
}

kangaroo22() {
  mkdir -p "$RESULTS/kangaroo22" "$RESULTS/$AB"
  local layer exports=() export
  for layer in "${KANGAROO_LAYERS[@]}"; do
    export=$HOME/work_kangaroo${layer}_s22/methods45/kangaroo$layer/export
    [ -f "$export/config.json" ] || { stamp "kangaroo $layer: no export"; continue; }
    exports+=("$export")
    bench22 "kangaroo${layer}_tree_3_4_12" "$PWD" "$export" "--depth 3 --topk 4 --budget 12" 5
    pack
  done
  [ ${#exports[@]} -gt 0 ] || return
  CUDA_VISIBLE_DEVICES=0 timeout 400 python3 tools/bench_kangaroo.py "${exports[@]}" --eta 0 --depth 3 \
    --choose-exit --prompts .data/mt_bench.jsonl --max-prompts 80 --out "$RESULTS/kangaroo22/sweep" \
    > "$RESULTS/kangaroo22_sweep.log" 2>&1
  stamp "kangaroo22 sweep: $(grep -c '^| ' "$RESULTS/kangaroo22_sweep.log") table lines"
  pack
  stamp "kangaroo22 done"
}

all22() {
  train22 &
  local training=$!
  kernels22
  wait "$training"
  ab22
  ops22
  kangaroo22
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then "${1:-all22}"; fi  # sourced: its functions only, status 0
