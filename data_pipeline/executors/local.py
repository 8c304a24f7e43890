"""Run a job -- a recipe's pipeline, or the clusters rounds alone -- in a local process pool, or one
task of one stage (what a SLURM array task runs).

A job has ``work`` (the store of its completion markers), ``stages()`` (stage, number of tasks) as far
as they are known, and ``run_task(stage, task)``. The pool runs the first stage with unfinished
tasks, then asks for the stages again: a stage that depends on the outcome of the one before (the
next clusters round) is listed only once that one has finished.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Protocol

from data_pipeline.executors.cpus import available_cpus
from data_pipeline.executors.tasks import done_tasks
from data_pipeline.errors import PipelineError
from data_pipeline.pipeline import Pipeline
from data_pipeline.recipe import Recipe
from glm_common.storage import Storage


class Job(Protocol):
    work: Storage

    def stages(self) -> list[tuple[str, int]]: ...

    def run_task(self, stage: str, task: int) -> None: ...


def _run_one(job: Job, stage: str, task: int) -> None:
    job.run_task(stage, task)


def next_stage(job: Job) -> tuple[str, int, list[int]] | None:
    """The first stage with unfinished tasks: (name, number of tasks, the unfinished ones)."""
    for name, n in job.stages():
        done = done_tasks(job.work, name) if n else set()
        pending = [t for t in range(n) if t not in done]
        if pending:
            return name, n, pending
    return None


def run_job(job: Job, *, workers: int = 0, progress: bool = True) -> None:
    """Every stage of ``job``, each task once (finished tasks are skipped)."""
    workers = workers or available_cpus()
    while (stage := next_stage(job)) is not None:
        name, n, pending = stage
        bar = _bar(name, n, n - len(pending), progress)
        if workers > 1 and len(pending) > 1:
            with ProcessPoolExecutor(min(workers, len(pending))) as pool:
                for _ in pool.map(_run_one, [job] * len(pending), [name] * len(pending), pending):
                    bar.update(1)
        else:
            for t in pending:
                job.run_task(name, t)
                bar.update(1)
        bar.close()


def run_stage(job: Job, stage: str, task: int | None = None) -> None:
    """All tasks of one stage, or one of them; every stage before it must have finished."""
    for name, n in job.stages():
        if name == stage:
            if task is not None and not 0 <= task < n:
                raise PipelineError(f"task {task} out of range: stage {stage!r} has {n} task(s)")
            for t in range(n) if task is None else [task]:
                job.run_task(stage, t)
            return
        missing = sorted(set(range(n)) - done_tasks(job.work, name))
        if missing:
            raise PipelineError(f"stage {stage!r} needs stage {name!r} finished; tasks {missing[:10]} are not")
    known = [name for name, _ in job.stages()]
    raise PipelineError(f"unknown stage {stage!r} (or not yet planned); stages now: {known}")


def run(recipe: Recipe, *, stage: str | None = None, task: int | None = None, progress: bool = True) -> Pipeline:
    """``glm data run``: the whole recipe, or one stage (``--stage``, ``--task``)."""
    pipe = Pipeline(recipe)
    pipe.prepare()
    if stage is not None:
        run_stage(pipe, stage, task)
    else:
        run_job(pipe, workers=recipe.workers, progress=progress)
    return pipe


def _bar(stage: str, total: int, done: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=done,
        desc=f"{stage:>12}",
        unit="task",
        file=sys.stderr,
        disable=not enabled or not sys.stderr.isatty(),
    )
