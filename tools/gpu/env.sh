# Source on the GPU machine (from the repository root, with .whl carried): installs the wheels it lacks, once
# per machine. DEEPSPEED=1 also builds DeepSpeed from its sdist (about 25 s).
if [ ! -f /tmp/site/.specdraft-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING || true
  touch /tmp/site/.specdraft-wheels
fi
if [ "${DEEPSPEED:-0}" = 1 ] && [ ! -d /tmp/site/deepspeed ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/deepspeed-*.tar.gz 2>&1 | grep -v WARNING || true
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export SPECDRAFT_CACHE=$HOME/.cache/specdraft GGUF=${GGUF:-$HOME/smol/SmolLM2-135M-Instruct.Q4_1.gguf}
# The wheels go on PYTHONPATH, not through an install, so no `specdraft` console script exists there: this stands in
# for it, in the scripts this shell starts too.
specdraft() { python3 -m specdraft.cli "$@"; }
export -f specdraft
