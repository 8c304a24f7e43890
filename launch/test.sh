#!/usr/bin/env bash
# Set up and run the whole test suite (slow tests included). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash launch/setup_env.sh || exit 1
. .venv/bin/activate
export WANDB_MODE=offline WANDB_SILENT=true TOKENIZERS_PARALLELISM=false
python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit $rc
