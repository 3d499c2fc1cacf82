#!/usr/bin/env bash
# PosS-1/2/3 and the Kangaroo exit-layer sweep next to an EAGLE-3 head on one GPU (issues 4 and 5), SmolLM2-135M-
# Instruct. Every run trains with tools/gpu/train_head.sh (the same distilled data, steps, batch, schedule and
# seed for every method), then the runtime benches it on MT-bench at T=0, lossless-checked against plain
# decoding: a chain of 6 (τ, acceptance by position, tokens/s, speedup over plain decoding in this runtime)
# and the default EAGLE-2 tree (depth 6, top-8, 48 nodes). Needs tools/gpu/env.sh sourced, $GGUF, the distilled
# set in $DATA (train_head.sh's default: .data/prev/data) and .data/mt_bench.jsonl.
# Usage: [RUNS="eagle3 poss1 poss2 poss3 kangaroo2 kangaroo4 kangaroo8"] [STEPS=N] [MAX_PROMPTS=80]
#        [EVAL_TOKENS=256] [EVAL_PROMPTS=FILE] [TREE=0] [KANGAROO_ETAS="0 0.3 0.5 0.7 0.9"]
#        [STAGES="train bench"] [BENCH_TAG=_alone] [BENCH_EXTRA="--no-overlap"] bash tools/gpu/methods45.sh
#        [train overrides for every run]
# STAGES=train trains and exports only; STAGES=bench benches runs trained before (so that several GPUs can train
# at once and each draft be benched later on an idle host); BENCH_TAG suffixes the bench directories and plots.
# Writes $WORK/methods45/<run>/{train,export,bench_chain,bench_tree,params.json}, then acceptance_chain.png/.json
# (and acceptance_tree.*) with their τ tables (tools/plot_acceptance.py); with KANGAROO_ETAS, the Kangaroo runs'
# ℓ × η sweep (tools/bench_kangaroo.py, DEL choosing ℓ among them too) in $WORK/methods45/kangaroo_sweep/.
set -euo pipefail
root=${WORK:-$HOME/work}/methods45
runs=${RUNS:-eagle3 poss1 poss2 poss3 kangaroo2 kangaroo4 kangaroo8}
bench=(--temperature 0 --no-hf --prompts "${EVAL_PROMPTS:-$PWD/.data/mt_bench.jsonl}"
       --max-new-tokens "${EVAL_TOKENS:-256}")
[ -n "${MAX_PROMPTS:-}" ] && bench+=(--max-prompts "$MAX_PROMPTS")
[ -n "${BENCH_EXTRA:-}" ] && read -r -a extra <<< "$BENCH_EXTRA" && bench+=("${extra[@]}")

method_args() {  # run name -> recipe, then method overrides
  case $1 in
    eagle3) echo "recipes/eagle3_smollm2.yaml" ;;
    poss1) echo "recipes/poss_smollm2.yaml method.positions_per_specialist=1 method.num_specialists=6" ;;
    poss2) echo "recipes/poss_smollm2.yaml method.positions_per_specialist=2 method.num_specialists=3" ;;
    poss3) echo "recipes/poss_smollm2.yaml method.positions_per_specialist=3 method.num_specialists=2" ;;
    kangaroo*) echo "recipes/kangaroo_smollm2.yaml method.exit_layer=${1#kangaroo}" ;;
    *) echo "unknown run $1; valid: eagle3 poss1 poss2 poss3 kangaroo<L>" >&2; return 2 ;;
  esac
}

stages=" ${STAGES:-train bench} " tag=${BENCH_TAG:-}
for name in $runs; do
  spec=$(method_args "$name")
  read -r -a args <<< "$spec"
  export_dir=$root/$name/export
  if [[ $stages == *" train "* ]]; then
    echo "=== $name train $(date +%T)"
    NAME=methods45/$name RECIPE=${args[0]} bash tools/gpu/train_head.sh "${args[@]:1}" "$@"
    python3 -c "import json, sys; from specdraft.drafts import load_draft; d = load_draft(sys.argv[1]).draft; \
print(json.dumps({'trainable_params': sum(p.numel() for p in d.parameters())}))" "$export_dir" \
      | tee "$root/$name/params.json"
  fi
  [[ $stages == *" bench "* ]] || continue
  echo "=== $name bench $(date +%T)"
  python3 -m specdraft.cli bench "$export_dir" --chain --depth 6 --exit-threshold 0 "${bench[@]}" \
    --out "$root/$name/bench_chain$tag"  # every method's full chain of 6; η is the Kangaroo sweep's (below)
  if [ "${TREE:-1}" = 1 ]; then
    python3 -m specdraft.cli bench "$export_dir" --depth 6 --topk 8 --budget 48 "${bench[@]}" \
      --out "$root/$name/bench_tree$tag"
  fi
done
[[ $stages == *" bench "* ]] || { echo "=== trained $(date +%T)"; exit 0; }
for kind in chain tree; do
  [ "$kind" = tree ] && [ "${TREE:-1}" != 1 ] && continue
  labels=()
  for name in $runs; do labels+=("$name=$root/$name/bench_$kind$tag/bench.json"); done
  python3 tools/plot_acceptance.py --out "$root/acceptance_$kind$tag.png" --title "MT-bench, T=0, $kind" "${labels[@]}"
done
if [ -n "${KANGAROO_ETAS:-}" ]; then  # the ℓ × η sweep of the Kangaroo runs, and DEL choosing among them
  exports=()
  for name in $runs; do [[ $name == kangaroo* ]] && exports+=("$root/$name/export"); done
  if [ ${#exports[@]} -gt 0 ]; then
    read -r -a etas <<< "$KANGAROO_ETAS"
    choose=(); [ ${#exports[@]} -gt 1 ] && choose=(--choose-exit)
    echo "=== kangaroo sweep $(date +%T)"
    python3 tools/bench_kangaroo.py "${exports[@]}" --eta "${etas[@]}" --depth 6 "${choose[@]}" \
      --prompts "${EVAL_PROMPTS:-$PWD/.data/mt_bench.jsonl}" --max-new-tokens "${EVAL_TOKENS:-256}" \
      ${MAX_PROMPTS:+--max-prompts "$MAX_PROMPTS"} --out "$root/kangaroo_sweep$tag"
  fi
fi
echo "=== done $(date +%T)"
