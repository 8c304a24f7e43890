"""``glm slurm submit``: check the config, then ``sbatch slurm/train.sbatch CONFIG [key=value ...]``.
``glm slurm submit-data``: the tokenizer here, then the encoding array and its merge job.
``glm slurm submit-pipeline``: the crawl pipeline, one job array per stage."""
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
PIPELINE_TEMPLATE = TEMPLATE.with_name("pipeline.sbatch")


def sbatch_command(args: argparse.Namespace) -> list[str]:
    cmd = ["sbatch", "--parsable", f"--nodes={args.nodes}"]
    if args.gpus_per_node:
        cmd.append(f"--gpus-per-node={args.gpus_per_node}")
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
    tasks = prepare_tokenizer(source=d.source, out_dir=d.shards_dir, tokenizer=d.tokenizer, profile=d.tokenizer_profile,
                              vocab_size=d.vocab_size, val_per_mille=d.val_per_mille,
                              shard_max_bytes=d.shard_max_bytes, text_field=d.text_field)
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
    """One job array per stage of the crawl pipeline, each depending on the one before."""
    from data_pipeline.pipeline import Pipeline
    from data_pipeline.recipe import load_recipe

    pipe = Pipeline(load_recipe(args.config, args.overrides))
    pipe.prepare()  # resolves and freezes the inputs; fails here, not in the queue, on a bad path
    common = [*args.sbatch_arg, *(f"--{f.replace('_', '-')}={getattr(args, f)}" for f in ("time", "partition", "account")
                                  if getattr(args, f)), str(PIPELINE_TEMPLATE), args.config, *args.overrides]
    previous, ids = None, []
    for stage, n in pipe.stages():
        if n == 0:
            continue
        cmd = ["sbatch", "--parsable", f"--array=0-{n - 1}", f"--job-name=glm-{stage}",
               *([f"--dependency=afterok:{previous}"] if previous else []), *common]
        if args.dry_run:
            print(f"GLM_STAGE={stage} " + shlex.join(cmd))
            previous = f"<{stage}>"
            continue
        previous = _sbatch(cmd, env={**os.environ, "GLM_STAGE": stage})
        ids.append(previous)
        print(f"stage {stage}: {n} task(s), job {previous}", file=sys.stderr)
    if not args.dry_run:
        print(" ".join(ids))
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="glm slurm", description=__doc__)
    ap.add_argument("action", choices=["submit", "submit-data", "submit-pipeline"])
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--gpus-per-node", type=int, default=0, help="0: CPU processes (GLM_PROCS_PER_NODE, default 1)")
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
    per_node = args.gpus_per_node or int(os.environ.get("GLM_PROCS_PER_NODE", 1))
    validate(load_config(args.config, args.overrides), world_size=args.nodes * per_node)  # fail before queueing
    cmd = sbatch_command(args)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    job_id = _sbatch(cmd)
    print(job_id)
    print(f"submitted job {job_id}; log: slurm-logs/{args.job_name or 'glm-train'}-{job_id}.out", file=sys.stderr)
    return 0
