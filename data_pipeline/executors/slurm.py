"""Run a recipe as SLURM job arrays (``glm slurm submit-pipeline``): one array per stage, each
``afterok`` the one before, every array task one task (``slurm/pipeline.sbatch`` runs
``glm data run --stage S --task $SLURM_ARRAY_TASK_ID``). Tasks, markers and outputs are the local
pool's: only the scheduling differs, and the output is byte-identical (tested).

The clusters rounds are not known at submission: each round decides whether another follows. They
run under a driver job (stage ``clusters``, one CPU, no data) that submits one array per round with
``sbatch --wait`` until the components are stars; the stages after it depend on the driver. A
failed round fails the driver and so the stages after it; a resubmission skips finished tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from data_pipeline.executors.local import next_stage
from data_pipeline.errors import PipelineError
from data_pipeline.pipeline import Pipeline
from data_pipeline.recipe import load_recipe

TEMPLATE = Path(__file__).resolve().parents[2] / "slurm" / "pipeline.sbatch"
DRIVER = "clusters"  # the stage name of the driver job
OPTIONS_ENV = "GLM_SBATCH_OPTIONS"  # the sbatch options of the submission, for the driver's arrays (JSON)


def submission(pipe: Pipeline) -> list[tuple[str, int]]:
    """The stages as submitted: the clusters rounds replaced by their driver (one job, no array)."""
    out: list[tuple[str, int]] = []
    for name, n in pipe.stages():
        if name.startswith(DRIVER + "-"):
            if (DRIVER, 1) not in out:
                out.append((DRIVER, 1))
        elif n:
            out.append((name, n))
    return out


def sbatch(cmd: list[str], stage: str, options: list[str]) -> str:
    """Submit; the job id. The child gets GLM_STAGE and the options, and none of a surrounding job's
    SLURM_* variables (a driver's own job must not leak into the arrays it submits)."""
    Path("slurm-logs").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env.update(GLM_STAGE=stage, **{OPTIONS_ENV: json.dumps(options)})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PipelineError(
            f"sbatch for stage {stage} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-500:]}"
        )
    return proc.stdout.strip().split(";")[0]


def submit(
    recipe: str, overrides: list[str], *, options: list[str], template: Path = TEMPLATE, dry_run: bool = False
) -> list[str]:
    """One array per stage (the driver for the clusters rounds); prints the job ids, returns them."""
    pipe = Pipeline(load_recipe(recipe, overrides))
    pipe.prepare()  # resolves and freezes the inputs; fails here, not in the queue, on a bad path
    previous, ids = None, []
    for stage, n in submission(pipe):
        array = [] if stage == DRIVER else [f"--array=0-{n - 1}"]
        cmd = [
            "sbatch",
            "--parsable",
            *array,
            f"--job-name=glm-{stage}",
            *([f"--dependency=afterok:{previous}"] if previous else []),
            *options,
            str(template),
            recipe,
            *overrides,
        ]
        if dry_run:
            print(f"GLM_STAGE={stage} " + shlex.join(cmd))
            previous = f"<{stage}>"
            continue
        previous = sbatch(cmd, stage, options)
        ids.append(previous)
        what = "driver of the rounds" if stage == DRIVER else f"{n} task(s)"
        print(f"stage {stage}: {what}, job {previous}", file=sys.stderr)
    if not dry_run:
        print(" ".join(ids))
    return ids


class _RoundsView:
    """The clusters rounds of a run as a job (for ``next_stage``)."""

    def __init__(self, pipe: Pipeline) -> None:
        from data_pipeline.stages.clusters import rounds

        self.work, self.rounds = pipe.work, rounds(pipe)

    def stages(self) -> list[tuple[str, int]]:
        return self.rounds.plan()

    def run_task(self, stage: str, task: int) -> None:
        raise PipelineError("the driver submits rounds, it does not run them")


def drive(recipe: str, overrides: list[str], *, options: list[str], template: Path = TEMPLATE) -> dict:
    """The driver job: one array per clusters round, each waited for, until the rounds end."""
    pipe = Pipeline(load_recipe(recipe, overrides))
    pipe.prepare()
    view = _RoundsView(pipe)
    while (stage := next_stage(view)) is not None:
        name, _, pending = stage
        cmd = [
            "sbatch",
            "--parsable",
            "--wait",
            f"--array={','.join(map(str, pending))}",
            f"--job-name=glm-{name}",
            *options,
            str(template),
            recipe,
            *overrides,
        ]
        job = sbatch(cmd, name, options)
        print(f"round {name}: {len(pending)} task(s), job {job} finished", file=sys.stderr)
    return view.rounds.final()


def main(argv: list[str] | None = None) -> int:
    """``python -m data_pipeline.executors.slurm drive -c RECIPE [key=value ...]`` (pipeline.sbatch)."""
    from glm_common.errors import GlmError

    ap = argparse.ArgumentParser(prog="python -m data_pipeline.executors.slurm", description=__doc__)
    ap.add_argument("action", choices=["drive"])
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_intermixed_args(argv)
    try:
        options = json.loads(os.environ.get(OPTIONS_ENV, "[]"))
        print(json.dumps(drive(args.config, args.overrides, options=options)))
    except (GlmError, PipelineError, FileNotFoundError) as err:
        print(f"clusters driver: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
