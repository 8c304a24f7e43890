"""``glm slurm submit``: check the config, then ``sbatch slurm/train.sbatch CONFIG [key=value ...]`` with
the GPUs (``--gpus-per-node N``) and cores it needs; a CPU partition takes ``--cpu`` instead.
``glm slurm submit-data``: the tokenizer here, then the encoding array and its merge job.
``glm slurm submit-pipeline``: the crawl pipeline, one job array per stage (``data_pipeline.executors.slurm``)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from glm_dist.config.checks import validate
from glm_dist.config.loader import load_config

TEMPLATE = Path(__file__).resolve().parents[1] / "slurm" / "train.sbatch"
DATA_TEMPLATE = TEMPLATE.with_name("data.sbatch")
# Cores asked for per GPU when --cpus-per-task is not given: the node's one task runs torchrun, a
# worker per GPU and their data-loader processes, and without the request SLURM binds it to one core.
# Every common 8-GPU node has at least this many (DGX H100: 14 per GPU, p4d/p5: 12/24).
CPUS_PER_GPU = 8


def gpu_request_error(args: argparse.Namespace) -> str | None:
    """Why ``glm slurm submit`` must not queue this job, or None: a job without GPUs silently trains
    on CPU processes with gloo, so that takes ``--cpu``."""
    if args.cpu and args.gpus_per_node:
        return f"--cpu and --gpus-per-node {args.gpus_per_node} contradict each other: drop one"
    if not args.cpu and args.gpus_per_node <= 0:
        return (
            "no GPUs requested: pass --gpus-per-node N (one training process per GPU), or --cpu to train "
            "with CPU processes and gloo on a CPU partition"
        )
    return None


def sbatch_command(args: argparse.Namespace) -> list[str]:
    cmd = ["sbatch", "--parsable", f"--nodes={args.nodes}"]
    if not args.cpu:
        cmd.append(f"--gpus-per-node={args.gpus_per_node}")
    cpus = args.cpus_per_task or (0 if args.cpu else CPUS_PER_GPU * args.gpus_per_node)
    if cpus:
        cmd.append(f"--cpus-per-task={cpus}")
    for flag in ("time", "partition", "account", "job_name"):
        if getattr(args, flag):
            cmd.append(f"--{flag.replace('_', '-')}={getattr(args, flag)}")
    return cmd + [*args.sbatch_arg, str(args.template), args.config, *args.overrides]


def _sbatch(cmd: list[str], env: dict | None = None) -> str:
    Path("slurm-logs").mkdir(exist_ok=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def submit_data(args: argparse.Namespace) -> int:
    from data_pipeline.tokenize.prepare import prepare_tokenizer

    d = load_config(args.config, args.overrides).data
    tasks = prepare_tokenizer(
        source=d.source,
        out_dir=d.shards_dir,
        tokenizer=d.tokenizer,
        profile=d.tokenizer_profile,
        vocab_size=d.vocab_size,
        val_per_mille=d.val_per_mille,
        shard_max_bytes=d.shard_max_bytes,
        text_field=d.text_field,
    )
    common = [*args.sbatch_arg, str(DATA_TEMPLATE), args.config, *args.overrides]
    array = ["sbatch", "--parsable", f"--array=0-{tasks - 1}", *common]
    merge = ["sbatch", "--parsable", "--dependency=afterok:{array}", *common]
    if args.dry_run:
        print(shlex.join(array))
        print("GLM_DATA_MERGE=1 " + shlex.join(merge))
        return 0
    array_id = _sbatch(array)
    merge_id = _sbatch([part.format(array=array_id) for part in merge], env={**os.environ, "GLM_DATA_MERGE": "1"})
    print(f"{array_id} {merge_id}")
    print(f"submitted {tasks} encoding tasks (job {array_id}) and the merge (job {merge_id})", file=sys.stderr)
    return 0


def submit_pipeline(args: argparse.Namespace) -> int:
    """The crawl pipeline: one job array per stage (``data_pipeline/executors/slurm.py``)."""
    from data_pipeline.executors.slurm import submit

    options = [
        *args.sbatch_arg,
        *(f"--{f.replace('_', '-')}={getattr(args, f)}" for f in ("time", "partition", "account") if getattr(args, f)),
    ]
    submit(args.config, args.overrides, options=options, dry_run=args.dry_run)
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="glm slurm", description=__doc__)
    ap.add_argument("action", choices=["submit", "submit-data", "submit-pipeline"])
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument(
        "--gpus-per-node",
        type=int,
        default=0,
        help="GPUs per node, one training process each (submit: required unless --cpu)",
    )
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="submit: a CPU partition; GLM_PROCS_PER_NODE CPU processes per node (default 1), gloo",
    )
    ap.add_argument(
        "--cpus-per-task",
        type=int,
        default=0,
        help=f"submit: cores per node for the launcher, its workers and their data loaders (default "
        f"{CPUS_PER_GPU} per GPU; with --cpu, SLURM's default)",
    )
    ap.add_argument("--time")
    ap.add_argument("--partition")
    ap.add_argument("--account")
    ap.add_argument("--job-name")
    ap.add_argument("--sbatch-arg", action="append", default=[], help="extra sbatch option, repeatable")
    ap.add_argument("--template", default=TEMPLATE)
    ap.add_argument("--dry-run", action="store_true", help="print the sbatch command, submit nothing")
    args = ap.parse_intermixed_args(argv)
    if args.action == "submit-data":
        return submit_data(args)
    if args.action == "submit-pipeline":
        return submit_pipeline(args)
    error = gpu_request_error(args)
    if error:
        print(f"glm slurm submit: error: {error}", file=sys.stderr)
        return 2
    per_node = int(os.environ.get("GLM_PROCS_PER_NODE", 1)) if args.cpu else args.gpus_per_node
    validate(load_config(args.config, args.overrides), world_size=args.nodes * per_node)  # fail before queueing
    cmd = sbatch_command(args)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    # a CPU job says so to the batch script, which refuses to start without GPUs otherwise
    job_id = _sbatch(cmd, env={**os.environ, "GLM_PROCS_PER_NODE": str(per_node)} if args.cpu else None)
    print(job_id)
    print(f"submitted job {job_id}; log: slurm-logs/{args.job_name or 'glm-train'}-{job_id}.out", file=sys.stderr)
    return 0
