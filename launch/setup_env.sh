#!/usr/bin/env bash
# Create ./.venv and install glm-dist into it (editable). Idempotent.
#   EXTRAS=test  also installs the test dependencies (transformers, pytest)
#   TORCH_SPEC   what to install for torch first (default torch==2.13.0: the CPU build on the
#                project's CI machines; on a CUDA machine PyPI serves the CUDA build of the same
#                release -- or set TORCH_SPEC to your own, e.g. "torch --index-url .../cu126").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
# torch first, pinned, so that nothing below pulls a different (multi-GB CUDA) build.
python -c "import torch" 2>/dev/null || python -m pip install -q ${TORCH_SPEC:-torch==2.13.0} 2>&1 | grep -v "is ignored" || true
python -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}" 2>&1 | grep -v "is ignored" || true
python -c "import torch, deepspeed, glm_dist" 2>/dev/null || { echo "setup failed: torch/deepspeed/glm_dist do not import" >&2; exit 1; }
