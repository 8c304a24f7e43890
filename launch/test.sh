#!/usr/bin/env bash
# Set up and run the whole test suite (slow tests included). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash launch/setup_env.sh || exit 1
. .venv/bin/activate
export WANDB_MODE=offline WANDB_SILENT=true TOKENIZERS_PARALLELISM=false
# The linter first (pyproject.toml [tool.ruff]): a lint error fails the run before any test.
python -m ruff check --quiet . || { echo "ruff check failed: fix the lines above (many: ruff check --fix .)" >&2; exit 1; }
python -m ruff format --check --quiet . || { echo "ruff format: the files above are not formatted (run: ruff format .)" >&2; exit 1; }
python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit $rc
