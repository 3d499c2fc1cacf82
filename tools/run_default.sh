#!/usr/bin/env bash
# The main job on the embedded default target (SmolLM2-135M-Instruct): distill -> train -> export -> eval.
# Usage: bash tools/run_default.sh [RECIPE] [key=value ...]   (default recipe: recipes/eagle3_smollm2.yaml)
#        SMOKE=1 bash tools/run_default.sh                     (the CPU smoke recipe; README says how long it takes)
# It ends by printing its wall time, the machine's cores and load average (stderr), then `done: EVAL_JSON`.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
default=recipes/eagle3_smollm2.yaml
[ "${SMOKE:-0}" = 1 ] && default=recipes/smoke/eagle3_smollm2.yaml
recipe=${1:-$default}
shift || true
spec=.venv/bin/specdraft
run_dir=$(.venv/bin/python -c "import sys; from specdraft.recipes import load_recipe; print(load_recipe(sys.argv[1], sys.argv[2:]).train.output_dir)" "$recipe" "$@")
export_dir=$(dirname "$run_dir")/export  # beside the training run: runs/NAME/{data,train,export}
$spec distill-data "$recipe" "$@"
$spec train "$recipe" "$@"
$spec export "$run_dir" --format hf --out "$export_dir"
$spec eval "$export_dir" "$@"
took=$((SECONDS - started))
printf 'run_default.sh: %d:%02d wall on %s CPU cores, load average %s\n' $((took / 60)) $((took % 60)) \
    "$(nproc 2>/dev/null || echo '?')" "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
echo "done: $export_dir/eval.json"
