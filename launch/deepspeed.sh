#!/usr/bin/env bash
# The DeepSpeed launcher with a hostfile ("host slots=N" lines; ssh between hosts, pdsh by default):
#   HOSTFILE=hostfile launch/deepspeed.sh train -c CONFIG [key=value ...]
# A hostfile naming only this machine runs locally without ssh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && . .venv/bin/activate
HOSTFILE=${HOSTFILE:-hostfile}
extra=()
if [ "$(grep -cv '^\s*\(#\|$\)' "$HOSTFILE")" = 1 ] && grep -qE '^\s*(localhost|127\.0\.0\.1|'"$(hostname)"')\s' "$HOSTFILE"; then
  extra=(--no_ssh_check --master_addr=127.0.0.1)
fi
exec deepspeed --hostfile="$HOSTFILE" "${extra[@]}" --module glm_dist.cli "$@"
