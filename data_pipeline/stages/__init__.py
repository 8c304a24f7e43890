"""The stages of a crawl-pipeline run, in order; one module each, named after its stage
(``pipeline.py`` lists what they do).

A stage module has two functions: ``plan(pipe) -> [(stage name, number of tasks)]`` (the clusters
stage lists one entry per round) and ``run(pipe, name, task) -> dict`` (one task; the dict is the
task's completion marker). Executors only call ``Pipeline.stages`` and ``Pipeline.run_task``.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

STAGE_ORDER = ("benchmarks", "filter", "buckets", "clusters", "removals", "decontam", "write", "card")
STAGES: tuple[ModuleType, ...] = tuple(import_module(f"data_pipeline.stages.{name}") for name in STAGE_ORDER)


def stage_module(name: str) -> ModuleType:
    """The module of a stage name (``clusters-003`` is a round of ``clusters``)."""
    return STAGES[STAGE_ORDER.index(name.split("-", 1)[0])]
