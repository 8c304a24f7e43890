#!/usr/bin/env bash
# Train on this workstation with every GPU (or N CPU processes: --nproc-per-node N):
#   launch/torchrun.sh train -c configs/experiments/gpt2-tiny-cpu.yaml [key=value ...]
#   launch/torchrun.sh --nproc-per-node 2 train -c configs/experiments/gpt2-tiny-cpu.yaml parallel.zero_stage=2
# torchrun --standalone with one process per visible GPU; SIGUSR1 to this process checkpoints and
# exits 75 (see glm launch --help).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && . .venv/bin/activate
exec glm launch "$@"
