"""Run a recipe: all stages with a local process pool, or one task of one stage (SLURM arrays)."""
from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor

from data_pipeline.executors.tasks import is_done
from data_pipeline.pipeline import STAGE_ORDER, Pipeline, PipelineError
from data_pipeline.recipe import Recipe


def _run_one(recipe: Recipe, stage: str, task: int) -> None:
    Pipeline(recipe).run_task(stage, task)


def run(recipe: Recipe, *, stage: str | None = None, task: int | None = None, progress: bool = True) -> Pipeline:
    pipe = Pipeline(recipe)
    pipe.prepare()
    if stage is not None:
        tasks = dict(pipe.stages())
        if stage not in tasks:
            raise PipelineError(f"unknown stage {stage!r}; stages: {list(STAGE_ORDER)}")
        for before in STAGE_ORDER[: STAGE_ORDER.index(stage)]:
            missing = [t for t in range(tasks[before]) if not is_done(pipe.work, before, t)]
            if missing:
                raise PipelineError(f"stage {stage!r} needs stage {before!r} finished; tasks {missing[:10]} are not")
        todo = range(tasks[stage]) if task is None else [task]
        if task is not None and not 0 <= task < tasks[stage]:
            raise PipelineError(f"task {task} out of range: stage {stage!r} has {tasks[stage]} task(s)")
        for t in todo:
            pipe.run_task(stage, t)
        return pipe
    workers = recipe.workers or os.cpu_count() or 1
    for name, n in pipe.stages():
        pending = [t for t in range(n) if not is_done(pipe.work, name, t)]
        if not pending:
            continue
        bar = _bar(name, n, n - len(pending), progress)
        if workers > 1 and len(pending) > 1:
            with ProcessPoolExecutor(min(workers, len(pending))) as pool:
                for _ in pool.map(_run_one, [recipe] * len(pending), [name] * len(pending), pending):
                    bar.update(1)
        else:
            for t in pending:
                pipe.run_task(name, t)
                bar.update(1)
        bar.close()
    return pipe


def _bar(stage: str, total: int, done: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"{stage:>10}", unit="task", file=sys.stderr,
                disable=not enabled or not sys.stderr.isatty())
