#!/usr/bin/env bash
# The main job on the embedded default target (SmolLM2-135M-Instruct): distill -> train -> export -> eval.
# Usage: bash tools/run_default.sh [RECIPE] [key=value ...]   (default recipe: recipes/eagle3_smollm2.yaml)
#        SMOKE=1 bash tools/run_default.sh                     (the CPU smoke recipe: 2-3 minutes on 2 idle cores)
set -euo pipefail
cd "$(dirname "$0")/.."
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
echo "done: $export_dir/eval.json"
