"""``glm data run``: the crawl pipeline of a recipe -- read, extract, filter, dedup, decontaminate, write --
whole, one stage, or one task of a stage (SLURM arrays)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_pipeline.executors.local import run as run_pipeline
from data_pipeline.pipeline import Pipeline
from data_pipeline.recipe import load_recipe
from glm_dist.commands.shared import folder_lock

HELP = "the crawl pipeline: read, extract, filter, dedup, decontaminate, write"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="a recipe, e.g. configs/data/fineweb.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. input=... output=... benchmarks=...")
    p.add_argument("--stage", help="run only this stage (all its tasks, or --task); for SLURM arrays")
    p.add_argument("--task", type=int, help="with --stage: run only this task")
    p.add_argument("--tasks", action="store_true", help="print each stage's task count as JSON and exit")


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.config, args.overrides)
    if args.tasks:
        pipe = Pipeline(recipe)
        pipe.prepare()
        print(json.dumps(dict(pipe.stages())))
        return 0
    with folder_lock(recipe.output, "glm data run", "output", task=args.task):
        pipe = run_pipeline(recipe, stage=args.stage, task=args.task)
    if args.stage is None:
        print(Path(pipe.out, "README.md").read_text())
    return 0
