#!/usr/bin/env bash
# One-GPU check of glm-dist on a machine with Python 3.12 and a CUDA build of torch but no network
# (and no deepspeed, webdataset or wandb): what the CPU suite cannot run, in at most 5 minutes.
#
#   bash bench/gpu_check.sh --prepare      # on a networked machine: the wheels, into $GLM_WHEELS_DIR
#   bash bench/gpu_check.sh [--out FILE]   # on the GPU machine: offline venv, then the stages
#   GLM_GPU_CHECK_CPU=1 bash bench/gpu_check.sh --out FILE   # the same stages on the CPU, tiny sizes
#
# --prepare builds DeepSpeed's wheel from its source release with the ops left to JIT
# (DS_BUILD_OPS=0; it needs torch where it is built) and downloads binary wheels for CPython 3.12 on
# x86_64 Linux of what the stages import beyond torch (the closure of $GLM_GPU_CHECK_PACKAGES, at the
# versions installed here, less $GLM_GPU_CHECK_SKIP: torch, the CUDA libraries and numpy stay the GPU
# machine's) into $GLM_WHEELS_DIR (default: wheelhouse/ in the repository, which travels with the
# working tree; if git ignores it, name it among the paths carried), and refuses more than 64 MiB of
# wheels and tracked files together (about 61 today: wandb 20, transformers 14, zstandard 6).
#
# The run: setup (a venv with --system-site-packages, so the machine's torch is used, and the wheels
# installed offline; skipped when the Python at hand imports everything), env (GPU, driver, torch),
# unit (tests/test_collectives.py with GLM_FORCE_COLLECTIVES=1, the GPT-2 parity tests), quickstart
# (configs/experiments/gpt2-tiny-cpu.yaml on the GPU, 100 steps), bench (bench/train_throughput.py:
# GPT-2 124M bf16 step beside transformers, MFU against the measured and the datasheet bf16 peak).
# Each stage has a timeout within the 5-minute budget ($GLM_GPU_CHECK_BUDGET_S), and the JSON of
# results ($OUT/gpu_check.json, or --out) is rewritten after every stage, so a run cut off still
# reports the stages it finished. Exit status: 0 when every stage passed.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=${GLM_WHEELS_DIR:-$REPO/wheelhouse}
PACKAGES=${GLM_GPU_CHECK_PACKAGES:-"deepspeed webdataset wandb tokenizers transformers fsspec zstandard pyyaml tqdm pytest pytest-timeout"}
# not carried: torch and what comes with it (a CUDA torch environment has numpy too)
SKIP=${GLM_GPU_CHECK_SKIP:-"torch triton nvidia-.* numpy setuptools pip"}
MAX_MIB=64  # the wheels and the tracked files together
CPU=${GLM_GPU_CHECK_CPU:-0}
BUDGET_S=${GLM_GPU_CHECK_BUDGET_S:-300}
OUT_JSON=${OUT:+$OUT/gpu_check.json}
OUT_JSON=${OUT_JSON:-$PWD/gpu_check.json}
PY=${PYTHON:-python3}

die() { echo "gpu_check: $*" >&2; exit 2; }

# -- prepare (networked machine) ------------------------------------------------------------------
closure() {  # name==version of $PACKAGES and their requirements as installed for "$1", minus torch's own
  "$1" - "$PACKAGES" "$SKIP" <<'PY'
import re, sys
from importlib import metadata
from packaging.requirements import Requirement

ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython", "extra": ""}
SKIP = re.compile("^(" + "|".join(sys.argv[2].split()) + ")$")
todo, seen = [n for n in sys.argv[1].split()], {}
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop().lower())
    if name in seen or SKIP.match(name):
        continue
    dist = metadata.distribution(name)
    seen[name] = dist.version
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(ENV):
            todo.append(req.name)
print(" ".join(f"{n}=={v}" for n, v in sorted(seen.items())))
PY
}

prepare() {
  local py=${PYTHON:-$REPO/.venv/bin/python}
  [ -x "$py" ] || py=python3
  mkdir -p "$WHEELS"
  rm -f "$WHEELS"/*.whl  # the folder holds this set only: its size is what travels
  local reqs ds_version
  reqs=$(closure "$py") || die "the packages to carry must be installed here first ($PACKAGES)"
  ds_version=$("$py" -c "import importlib.metadata as m; print(m.version('deepspeed'))")
  echo "building deepspeed $ds_version (ops left to JIT) and downloading: $reqs"
  DS_BUILD_OPS=0 "$py" -m pip wheel --no-deps --no-build-isolation -w "$WHEELS" "deepspeed==$ds_version" \
    || die "building the DeepSpeed wheel failed"
  # shellcheck disable=SC2086  # one argument per requirement
  "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" $(echo "$reqs" | tr ' ' '\n' | grep -v '^deepspeed==') || die "downloading the wheels failed"
  ls -lS "$WHEELS"
  local mib  # the wheels and the repository's tracked files: what travels to the GPU machine
  mib=$( (ls "$WHEELS"/*.whl; git -C "$REPO" ls-files | sed "s|^|$REPO/|") | "$py" -c \
    "import os, sys; print(-(-sum(os.path.getsize(p.strip()) for p in sys.stdin if os.path.isfile(p.strip())) // 2**20))")
  [ "$mib" -le "$MAX_MIB" ] || die "$WHEELS and the repository hold $mib MiB, over $MAX_MIB MiB: add packages the GPU machine has to GLM_GPU_CHECK_SKIP"
  echo "$WHEELS and the repository: $mib MiB of at most $MAX_MIB"
}

# -- the run -------------------------------------------------------------------------------------
START=$(date +%s)
record() {  # record NAME RC SECONDS LOG [METRICS_JSON]: add a stage to $OUT_JSON (rewritten atomically)
  "$PY" - "$OUT_JSON" "$@" <<'PY'
import json, os, sys, time
path, name, rc, seconds, log = sys.argv[1:6]
metrics = json.loads(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] else {}
try:
    with open(path) as f:
        out = json.load(f)
except (OSError, ValueError):
    out = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "stages": {}}
tail = open(log, errors="replace").read().splitlines()[-25:] if os.path.exists(log) else []
rc = int(rc)
out["stages"][name] = {"ok": rc == 0, "rc": rc, "timed_out": rc in (124, 137), "seconds": float(seconds),
                       **metrics, "log_tail": tail}
out["ok"] = all(s["ok"] for s in out["stages"].values())
os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(out, f, indent=1)
os.replace(path + ".tmp", path)
PY
}

left() { echo $((BUDGET_S - ($(date +%s) - START))); }

stage() {  # stage NAME SECONDS PARSER CMD...: run CMD with a timeout of min(SECONDS, budget left), then record it
  local name=$1 limit=$2 parser=$3 log="$WORK/$1.log" t0 rc metrics
  shift 3
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  if [ "$limit" -le 0 ]; then
    echo "budget spent" >"$log"; record "$name" 124 0 "$log"; return 124
  fi
  echo "== $name (up to ${limit}s)"
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
  rc=$?
  metrics=$($parser "$log" 2>/dev/null || true)
  record "$name" "$rc" "$(($(date +%s) - t0))" "$log" "$metrics"
  tail -n 3 "$log"
  return "$rc"
}

no_metrics() { :; }

env_metrics() { "$PY" -c "import json, sys; print(json.dumps(json.loads(open(sys.argv[1]).read().splitlines()[-1])))" "$1"; }

pytest_metrics() {  # the summary line: "N passed, M failed in S s"
  "$PY" -c "
import json, re, sys
lines = [l for l in open(sys.argv[1]) if re.search(r'\d+ (passed|failed|error)', l)]
print(json.dumps({'summary': lines[-1].strip('= \n')} if lines else {}))" "$1"
}

quickstart_metrics() {  # first and last train loss, median tokens/s and MFU, the last validation loss
  "$PY" -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + '/metrics.jsonl')]
train = [r for r in rows if r.get('kind') == 'train']
val = [r for r in rows if r.get('kind') == 'val']
out = {'steps': len(train), 'first_loss': train[0]['loss'], 'last_loss': train[-1]['loss']}
for key in ('tokens_per_s', 'mfu'):
    vals = [r[key] for r in train[len(train) // 2:] if r.get(key) is not None]
    if vals:
        out[key] = statistics.median(vals)
if val:
    out['val_loss'] = val[-1].get('val_loss')
print(json.dumps(out))" "$WORK/quickstart"
}

resume_metrics() {  # the step resumed from and the steps after it, from the run's log and metrics
  "$PY" -c "
import json, re, sys
log = open(sys.argv[1]).read()
found = re.search(r'resumed from \\S+ at step (\\d+)', log)
rows = [json.loads(l) for l in open(sys.argv[2] + '/metrics.jsonl')]
train = [r for r in rows if r.get('kind') == 'train']
print(json.dumps({'resumed_at': int(found.group(1)) if found else None, 'steps': len(train),
                  'last_loss': train[-1]['loss'] if train else None}))
sys.exit(0 if found else 1)" "$1" "$WORK/quickstart"
}

bench_metrics() {  # the table's rows: tokens/s of both, the ratio, MFU against the measured and the datasheet peak
  "$PY" -c "
import json, sys
keys = ['glm_tokens_per_s', 'hf_tokens_per_s', 'ratio', 'mfu_measured', 'hf_mfu_measured', 'mfu_datasheet', 'hf_mfu_datasheet']
rows = {}
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if line.startswith('| ') and len(cells) == 8 and cells[1][:1].isdigit():
        rows[cells[0]] = dict(zip(keys, cells[1:]))
peaks = [l.strip() for l in open(sys.argv[1]) if l.startswith(('measured matmul peak', 'reference peak', 'GPT-2 config'))]
print(json.dumps({'rows': rows, 'setup': peaks}))" "$1"
}

can_import() { "$1" -c "import deepspeed, webdataset, wandb, tokenizers, transformers, pytest" >/dev/null 2>&1; }

setup() {  # the Python to run with, written to $WORK/python: the one at hand if it has everything, else an offline venv
  if can_import "$PY"; then
    echo "using $PY: deepspeed, webdataset, wandb, tokenizers, transformers and pytest import"
    # DeepSpeed's CPU collective op, built here rather than inside a later stage's timeout
    [ "$CPU" = 1 ] && { "$PY" "$REPO/launch/build_ops.py" || return 2; }
    echo "$PY" >"$WORK/python"
    return 0
  fi
  [ -d "$WHEELS" ] || { echo "no $WHEELS: run bash bench/gpu_check.sh --prepare on a networked machine"; return 2; }
  local venv=${GLM_GPU_CHECK_VENV:-$WORK/venv}
  "$PY" -m venv --system-site-packages "$venv" || return 2
  # shellcheck disable=SC2086  # one argument per package
  "$venv/bin/python" -m pip install --no-index --find-links "$WHEELS" $PACKAGES || return 2
  "$venv/bin/python" -c "import torch; print('torch', torch.__version__, 'from', torch.__file__)"
  can_import "$venv/bin/python" && echo "$venv/bin/python" >"$WORK/python"
}

env_report() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$PY" - "$CPU" <<'PY'
import json, sys
import torch
from glm_dist.observability.flops import peak_flops
cuda = torch.cuda.is_available()
name = torch.cuda.get_device_name() if cuda else "cpu"
info = {"torch": torch.__version__, "cuda": cuda, "cuda_version": torch.version.cuda, "device": name,
        "bf16_datasheet_tflops": (peak_flops(name, "bf16") or 0) / 1e12 if cuda else None}
print(json.dumps(info))
sys.exit(0 if cuda or sys.argv[1] == "1" else 3)  # no GPU: only GLM_GPU_CHECK_CPU=1 goes on
PY
}

run() {
  WORK=${GLM_GPU_CHECK_WORK:-$(mktemp -d -t glm-gpu-check.XXXXXX)}
  mkdir -p "$WORK"
  rm -f "$OUT_JSON"
  cd "$REPO" || exit 2
  export WORK PY CPU WHEELS PACKAGES PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} WANDB_MODE=offline WANDB_SILENT=true \
    TOKENIZERS_PARALLELISM=false
  local failed=0 self=("bash" "$REPO/bench/gpu_check.sh" --stage) tests quick bench half
  if [ "$CPU" = 1 ]; then  # tiny sizes: the same stages in about a minute on 2 cores
    export CUDA_VISIBLE_DEVICES=""
    tests=(tests/test_collectives.py tests/test_hf_parity.py
           -k "micro_batch_makes_no_host_sync and gpt or logits_match_transformers_after_import")
    half=3 quick=(train.max_steps=5 model.n_layer=1 model.d_model=64 model.n_head=4 data.seq_len=64 train.micro_batch_size=4
           train.eval_batches=2 train.precision=fp32 parallel.zero_stage=0 data.vocab_size=2048 train.warmup_steps=1)
    bench=(--n-layer 1 --d-model 64 --n-head 4 --seq-len 64 --batch 2 --modes fp32 --rounds 1 --steps 1)
  else
    tests=(tests/test_collectives.py tests/test_hf_parity.py)
    half=50 quick=(train.max_steps=100)
    bench=(--n-layer 12 --seq-len 1024 --batch 16 --modes bf16 --rounds 3 --steps 3)
  fi
  stage setup 60 no_metrics "${self[@]}" setup || { echo "setup failed: see $OUT_JSON"; exit 2; }
  PY=$(cat "$WORK/python") && export PY
  stage env 20 env_metrics "${self[@]}" env_report || exit 2
  # A world of one runs every collective (tests/test_collectives.py), so each call site of the
  # training path -- validation, the step's all-reduce, the sharded save and its agreement, the
  # resume -- goes through NCCL on the GPU.
  export GLM_FORCE_COLLECTIVES=1
  stage unit 90 pytest_metrics "$PY" -m pytest -q -x -p no:cacheprovider "${tests[@]}" || failed=1
  local train=("$PY" -m glm_dist.cli train -c configs/experiments/gpt2-tiny-cpu.yaml "train.out_dir=$WORK/quickstart"
               "data.shards_dir=$WORK/shards" logging.wandb=false train.plot=false train.save_interval=0 "${quick[@]}")
  # stopped halfway with a checkpoint (an asynchronous save from pinned host memory), then resumed
  stage quickstart 50 quickstart_metrics "${train[@]}" "train.stop_at_step=$half" || failed=1
  stage resume 40 resume_metrics "${train[@]}" train.resume=auto || failed=1
  unset GLM_FORCE_COLLECTIVES
  stage bench 80 bench_metrics "$PY" bench/train_throughput.py "${bench[@]}" || failed=1
  echo "results: $OUT_JSON"
  exit "$failed"
}

case "${1:-}" in
  --prepare) prepare ;;
  --stage) case "$2" in setup|env_report) "$2" ;; *) die "no stage $2" ;; esac ;;  # internal: under the stage's timeout
  --out) OUT_JSON=$(realpath -m "${2:?--out FILE}"); run ;;
  "") run ;;
  *) die "usage: bash bench/gpu_check.sh [--prepare | --out FILE]" ;;
esac
