#!/usr/bin/env bash
# One-GPU check of glm-dist on a machine with a CUDA build of torch but no network (and no deepspeed,
# webdataset or wandb): what the CPU suite cannot run, in at most 8 minutes with the setup.
#
#   bash bench/gpu_check.sh --prepare      # on a networked machine: the wheels, into $GLM_WHEELS_DIR
#   bash bench/gpu_check.sh [--out FILE]   # on the GPU machine: an offline environment, then the stages
#   GLM_GPU_CHECK_CPU=1 bash bench/gpu_check.sh --out FILE   # the same stages on the CPU, tiny sizes
#
# --prepare builds DeepSpeed's wheel from its source release with the ops left to JIT
# (DS_BUILD_OPS=0; it needs torch where it is built) and downloads binary wheels for CPython
# $GLM_GPU_CHECK_PYTHON_VERSION (3.12, the GPU machine's) on x86_64 Linux of what the stages import
# beyond the machine's own packages (the closure of $GLM_GPU_CHECK_PACKAGES at the versions installed
# here, less $GLM_GPU_CHECK_SKIP: torch, the CUDA libraries, numpy and the Hugging Face stack stay the
# machine's) into $GLM_WHEELS_DIR (default: wheelhouse/ in the repository; git ignores it, so name it
# among the paths carried to the machine), with prepared.json saying for which Python; it refuses more
# than 64 MiB of wheels and tracked files together.
#
# The run, each stage with a timeout within the budget ($GLM_GPU_CHECK_BUDGET_S, 480 s) and the JSON of
# results ($OUT/gpu_check.json, or --out) rewritten after every stage, so a run cut off still reports
# what it finished; a summary table at the end (bench/gpu_check_report.py). Exit status 0 when every
# stage passed, 2 when there is no GPU (unless GLM_GPU_CHECK_CPU=1) or no environment.
#   env          GPU, driver, torch (with the Python at hand)
#   setup        bench/gpu_check_env.py: a venv that sees the Python at hand's packages through a .pth
#                file (that Python is itself a venv on the GPU machine: --system-site-packages would
#                show the interpreter beneath it, without torch), the wheels installed offline after a
#                check that they were made for this Python, every import checked from a child with a
#                cleaned environment
#   unit         the collective and transformers-parity tests, all of them (no -x)
#   quickstart   configs/experiments/gpt2-tiny-cpu.yaml stopped halfway with a sharded checkpoint, then
#   resume       resumed to the end -- both with GLM_FORCE_COLLECTIVES=1, so validation, the step's
#                all-reduce, the save's agreement and the resume run NCCL collectives in a world of one;
#                the device memory readings must be in the metrics on CUDA (and absent on the CPU)
#   resume_exact tests/test_resume_exact.py: a resumed run's losses and weights equal an uninterrupted
#                one's, bf16 at ZeRO 0-3 (collected only on the CPU: the suite runs it there)
#   throughput   glm train, GPT-2 124M bf16 at seq 1024: tokens/s, MFU and peak memory at micro-batches
#                8 and 32
#   profile      bench/train_throughput.py --profile-only: the 124M step's kernel time per kind and the
#                GPU's idle share of the step (on the CPU: CPU self time per operator group)
#   memory       bench/gpu_check_memory.py: measured peak memory against glm plan, GPT-2 medium, large and
#                XL at ZeRO 0-3
#   bench        bench/train_throughput.py: the 124M step beside transformers, eager, with compiled blocks
#                and compiled whole (train.compile=blocks / model; not on the CPU: inductor's C++ build
#                takes minutes), MFU against the measured and the datasheet peak
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=${GLM_WHEELS_DIR:-$REPO/wheelhouse}
PACKAGES=${GLM_GPU_CHECK_PACKAGES:-"deepspeed webdataset wandb tokenizers transformers fsspec zstandard pyyaml tqdm pytest pytest-timeout"}
# the GPU machine's own: torch and what comes with it, the Hugging Face stack (transformers 5.17 there)
SKIP=${GLM_GPU_CHECK_SKIP:-"torch triton nvidia-.* numpy setuptools pip transformers tokenizers huggingface-hub hf-xet safetensors"}
TARGET_PY=${GLM_GPU_CHECK_PYTHON_VERSION:-3.12}
MAX_MIB=64  # the wheels and the tracked files together
CPU=${GLM_GPU_CHECK_CPU:-0}
BUDGET_S=${GLM_GPU_CHECK_BUDGET_S:-480}
OUT_JSON=${OUT:+$OUT/gpu_check.json}
OUT_JSON=${OUT_JSON:-$PWD/gpu_check.json}
PY=${PYTHON:-python3}
REPORT=$REPO/bench/gpu_check_report.py

die() { echo "gpu_check: $*" >&2; exit 2; }

# -- prepare (networked machine) ------------------------------------------------------------------
closure() {  # name==version of $PACKAGES and their requirements as installed for "$1", minus $SKIP
  "$1" - "$PACKAGES" "$SKIP" "$TARGET_PY" <<'PY'
import re, sys
from importlib import metadata
from packaging.requirements import Requirement

ENV = {"python_version": sys.argv[3], "python_full_version": sys.argv[3] + ".0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
       "extra": ""}
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
  rm -f "$WHEELS"/*.whl "$WHEELS/prepared.json"  # the folder holds this set only: its size is what travels
  local reqs ds_version
  reqs=$(closure "$py") || die "the packages to carry must be installed here first ($PACKAGES)"
  ds_version=$("$py" -c "import importlib.metadata as m; print(m.version('deepspeed'))")
  echo "building deepspeed $ds_version (ops left to JIT) and downloading for CPython $TARGET_PY: $reqs"
  DS_BUILD_OPS=0 "$py" -m pip wheel --no-deps --no-build-isolation -w "$WHEELS" "deepspeed==$ds_version" \
    || die "building the DeepSpeed wheel failed"
  # shellcheck disable=SC2046  # one argument per requirement
  "$py" -m pip download --no-deps --only-binary=:all: --python-version "$TARGET_PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" $(echo "$reqs" | tr ' ' '\n' | grep -v '^deepspeed==') || die "downloading the wheels failed"
  printf '{"python": "%s", "requirements": "%s"}\n' "$TARGET_PY" "$reqs" >"$WHEELS/prepared.json"
  ls -lS "$WHEELS"
  local mib  # the wheels and the repository's tracked files: what travels to the GPU machine
  mib=$( (ls "$WHEELS"/*; git -C "$REPO" ls-files | sed "s|^|$REPO/|") | "$py" -c \
    "import os, sys; print(-(-sum(os.path.getsize(p.strip()) for p in sys.stdin if os.path.isfile(p.strip())) // 2**20))")
  [ "$mib" -le "$MAX_MIB" ] || die "$WHEELS and the repository hold $mib MiB, over $MAX_MIB MiB: add packages the GPU machine has to GLM_GPU_CHECK_SKIP"
  echo "$WHEELS and the repository: $mib MiB of at most $MAX_MIB"
}

# -- the run -------------------------------------------------------------------------------------
START=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

stage() {  # stage NAME SECONDS CMD...: run CMD with a timeout of min(SECONDS, budget left), then record it
  local name=$1 limit=$2 log="$WORK/$1.log" t0 rc
  shift 2
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  if [ "$limit" -le 0 ]; then
    echo "budget spent" >"$log"; "$PY" "$REPORT" stage "$OUT_JSON" "$name" 124 0 "$log" "$WORK"; return 124
  fi
  echo "== $name (up to ${limit}s)"
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
  "$PY" "$REPORT" stage "$OUT_JSON" "$name" "$?" "$(($(date +%s) - t0))" "$log" "$WORK"
  rc=$?
  tail -n 3 "$log"
  return "$rc"
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

setup() {  # the venv (see bench/gpu_check_env.py); its python written to $WORK/python
  local venv=${GLM_GPU_CHECK_VENV:-$WORK/venv}
  # shellcheck disable=SC2086  # one argument per package
  "$PY" "$REPO/bench/gpu_check_env.py" "$venv" $PACKAGES --wheels "$WHEELS" --repo "$REPO" || return 2
  # DeepSpeed's CPU collective op, built here rather than inside a later stage's timeout
  [ "$CPU" = 1 ] && { "$venv/bin/python" "$REPO/launch/build_ops.py" || return 2; }
  echo "$venv/bin/python" >"$WORK/python"
}

throughput() {  # glm train at two micro-batches, into $WORK/throughput_mbN
  local mb sizes=(8 32) model=(model.flavor=gpt2-small data.seq_len=1024 train.precision=bf16 train.max_steps=30
                              logging.log_interval=5)
  if [ "$CPU" = 1 ]; then
    sizes=(2 4) model=(model.n_layer=1 model.d_model=64 model.n_head=4 data.seq_len=64 data.vocab_size=2048
                       train.precision=fp32 train.max_steps=4 logging.log_interval=2)
  fi
  for mb in "${sizes[@]}"; do
    "$PY" -m glm_dist.cli train -c configs/experiments/gpt2-tiny-cpu.yaml "train.out_dir=$WORK/throughput_mb$mb" \
      "data.shards_dir=$WORK/shards" logging.wandb=false logging.progress=false train.plot=false train.save_interval=0 \
      train.eval_interval=0 train.eval_batches=1 train.warmup_steps=2 parallel.zero_stage=0 \
      "train.micro_batch_size=$mb" "${model[@]}" || return 1
  done
}

seed_ops() {  # seed_ops TO: DeepSpeed's CPU op as launch/setup_env.sh built it for $PY, copied into TO
  # Without its lock, and with its files' times kept: ninja finds it up to date and the setup's build
  # takes seconds, not 35-110 s. An op built against other sources or flags (the check's own deepspeed)
  # has another build.ninja, which torch rewrites, and ninja builds it again: a copy is never wrong.
  local op  # torch's folder: $TORCH_EXTENSIONS_DIR/NAME, or a pyXY_cpu folder under the user's cache
  op=$("$PY" -c 'import sys; print("py%d%d_cpu" % sys.version_info[:2])') || return 0
  op=${TORCH_EXTENSIONS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/torch_extensions/$op}/deepspeed_shm_comm
  [ -f "$op/deepspeed_shm_comm.so" ] && [ ! -e "$op/lock" ] || return 0  # none, or a build under way
  mkdir -p "$1/deepspeed_shm_comm" \
    && find "$op" -maxdepth 1 -type f ! -name lock -exec cp -p {} "$1/deepspeed_shm_comm/" \;
}

run() {
  WORK=${GLM_GPU_CHECK_WORK:-$(mktemp -d -t glm-gpu-check.XXXXXX)}
  mkdir -p "$WORK"
  rm -f "$OUT_JSON"
  cd "$REPO" || exit 2
  export WORK PY CPU WHEELS PACKAGES PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} WANDB_MODE=offline WANDB_SILENT=true \
    TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  local failed=0 self=("bash" "$REPO/bench/gpu_check.sh" --stage) unit exact quick bench memory profile half setup_s=90
  if [ "$CPU" = 1 ]; then  # tiny sizes: the same stages in about two minutes on 2 cores
    # The CPU collective op is built into the check's own folder: a stage killed by its timeout while
    # torch builds it leaves a 'lock' there that would make every later DeepSpeed process on the
    # machine (the rest of the suite) wait on the shared ~/.cache/torch_extensions for ever. It starts
    # from a copy of the shared one's finished build, where there is one.
    seed_ops "$WORK/torch_extensions"
    export TORCH_EXTENSIONS_DIR=$WORK/torch_extensions
    setup_s=240  # the CPU setup builds DeepSpeed's CPU collective op when it copied none: 35-110 s on 2 busy cores
    export CUDA_VISIBLE_DEVICES=""
    unit=(tests/test_collectives.py tests/test_hf_parity.py
          -k "micro_batch_makes_no_host_sync and gpt or logits_match_transformers_after_import")
    exact=(-k bf16 --collect-only)
    half=3 quick=(train.max_steps=5 model.n_layer=1 model.d_model=64 model.n_head=4 data.seq_len=64 train.micro_batch_size=4
           train.eval_batches=2 train.precision=fp32 parallel.zero_stage=0 data.vocab_size=2048 train.warmup_steps=1
           logging.log_interval=2)
    local tiny=(--n-layer 1 --d-model 64 --n-head 4 --seq-len 64 --batch 2 --modes fp32)
    bench=("${tiny[@]}" --rounds 1 --steps 1 --peak-budget-s 1) profile=("${tiny[@]}")
    memory=(--flavors gpt2-medium --zero 3 --shrink n_layer=1,d_model=64,n_head=4,vocab_size=2048 --seq-len 64
            --batch 2 --steps 1)
  else
    unit=(tests/test_collectives.py tests/test_hf_parity.py)
    exact=(-k bf16)
    half=50 quick=(train.max_steps=100 logging.log_interval=10)
    local gpt2=(--n-layer 12 --seq-len 1024 --batch 16 --modes bf16)
    bench=("${gpt2[@]}" --compile both --rounds 3 --steps 3) profile=("${gpt2[@]}")
    memory=()
  fi
  stage env 30 "${self[@]}" env_report || { "$PY" "$REPORT" summary "$OUT_JSON"; exit 2; }
  stage setup "$setup_s" "${self[@]}" setup || { "$PY" "$REPORT" summary "$OUT_JSON"; exit 2; }
  PY=$(cat "$WORK/python") && export PY
  # A world of one runs every collective (tests/test_collectives.py), so each call site of the
  # training path -- validation, the step's all-reduce, the sharded save and its agreement, the
  # resume -- goes through NCCL on the GPU.
  export GLM_FORCE_COLLECTIVES=1
  stage unit 120 "$PY" -m pytest -q -p no:cacheprovider "${unit[@]}" || failed=1
  local train=("$PY" -m glm_dist.cli train -c configs/experiments/gpt2-tiny-cpu.yaml "train.out_dir=$WORK/quickstart"
               "data.shards_dir=$WORK/shards" logging.wandb=false train.plot=false train.save_interval=0 "${quick[@]}")
  # stopped halfway with a checkpoint (an asynchronous save from pinned host memory), then resumed
  stage quickstart 60 "${train[@]}" "train.stop_at_step=$half" || failed=1
  stage resume 45 "${train[@]}" train.resume=auto || failed=1
  unset GLM_FORCE_COLLECTIVES
  stage resume_exact 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_resume_exact.py "${exact[@]}" || failed=1
  stage throughput 90 "${self[@]}" throughput || failed=1
  stage profile 60 "$PY" bench/train_throughput.py "${profile[@]}" --profile-only --json "$WORK/profile.json" || failed=1
  stage memory 120 "$PY" bench/gpu_check_memory.py "${memory[@]}" --json "$WORK/memory.json" || failed=1
  # last: inductor's compilation is the longest and least predictable part (blocks, then the whole model)
  stage bench 270 "$PY" bench/train_throughput.py "${bench[@]}" --json "$WORK/bench.json" || failed=1
  "$PY" "$REPORT" summary "$OUT_JSON"
  exit "$failed"
}

case "${1:-}" in
  --prepare) prepare ;;
  --stage) case "$2" in setup|env_report|throughput) "$2" ;; *) die "no stage $2" ;; esac ;;  # internal: under the stage's timeout
  --out) OUT_JSON=$(realpath -m "${2:?--out FILE}"); run ;;
  "") run ;;
  *) die "usage: bash bench/gpu_check.sh [--prepare | --out FILE]" ;;
esac
