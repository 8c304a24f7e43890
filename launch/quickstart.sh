#!/usr/bin/env bash
# Set up and run the main job: a tiny GPT-2 pretrained on the embedded corpus (no download).
# Extra arguments are config overrides, e.g.  launch/quickstart.sh train.max_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup_env.sh
. .venv/bin/activate
exec glm train -c configs/experiments/gpt2-tiny-cpu.yaml "$@"
