#!/usr/bin/env bash
# Create ./.venv and install glm-dist into it (editable). Idempotent; pip's log: .venv/install.log
#   EXTRAS=test  also installs the test dependencies (transformers, pytest)
#   TORCH_SPEC   what to install for torch first (default torch==2.13.0: the CPU build on the
#                project's CI machines; on a CUDA machine PyPI serves the CUDA build of the same
#                release -- or set your own, e.g. TORCH_SPEC="torch --index-url <your CUDA index>").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
log=.venv/install.log
install() {
  echo "+ pip install $*" >> "$log"
  python -m pip install --progress-bar off "$@" >> "$log" 2>&1 || { echo "pip install $* failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
}
install --upgrade pip
# torch first, pinned, so that nothing below pulls a different (multi-GB CUDA) build.
python -c "import torch" 2>/dev/null || install ${TORCH_SPEC:-torch==2.13.0}
install -e ".${EXTRAS:+[$EXTRAS]}"
python -c "import torch, deepspeed, glm_dist" 2>/dev/null || { echo "setup failed: torch/deepspeed/glm_dist do not import" >&2; exit 1; }
