"""``glm data run``: raw crawl -> filtered, deduplicated, decontaminated JSONL shards + data card.

A run is a list of stages, each a set of independent tasks (``stages/``, one module each); the
executors (``executors/``: a local process pool, SLURM job arrays) only decide where tasks run:

  benchmarks (1)        benchmark files -> n-gram index
  filter (per input)    read -> url -> extract -> language -> quality rules; keeps documents in a
                        work file with their benchmark n-gram hits, and their exact and MinHash band
                        keys split by hash range
  buckets (P)           one hash range of every band and of the exact keys -> candidate pairs
  clusters (P per round) connected components of the pairs, one partition per task, in rounds
                        until every component is a star around its first document
  removals (per input)  which documents each input loses to dedup; benchmark hits of the others
  decontam (P)          one hash range of the benchmark n-grams: frequent ones ignored, dirty items
  write (per input)     dedup removals + decontamination -> documents/*.jsonl.gz (+ dropped/)
  card (1)              stats.json, contamination.json, data card (README.md), funnel.png, and last
                        manifest.json, which makes the output visible (``manifest.py``)

No task holds the corpus: the corpus-wide stages hold one of ``P`` hash partitions (``partitions``).
Everything a task writes appears whole (``storage.py``) and its completion marker comes last, so a
rerun after a crash or preemption skips finished tasks and produces the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import logging

from data_pipeline.errors import PipelineError
from data_pipeline.executors.tasks import read_marker, run_once
from data_pipeline.recipe import Recipe
from glm_common.storage import Storage

log = logging.getLogger(__name__)
MAX_PARTITIONS_BY_DEFAULT = 256
MAX_RUN_JSON_BYTES = 256 * 2**20


class Pipeline:
    """One run of a recipe: its output location, its frozen inputs and the stages that fill it."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.store = Storage(recipe.output)
        self.out = self.store.url  # an absolute path, or a URL
        self.work = self.store.child("work")
        self._identity: dict | None = None
        self._finished: dict[str, dict] = {}  # markers of finished stages that plans read (immutable)

    # -- setup ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Resolve the inputs (materialising the embedded sample crawl if asked) and freeze them
        with the recipe in work/run.json; a later run in the same output must match."""
        inputs, benchmarks = self._resolve(self.recipe.input), self._resolve(self.recipe.benchmarks, bench=True)
        parts = self.recipe.partitions or max(1, min(len(inputs), MAX_PARTITIONS_BY_DEFAULT))
        identity = {
            "inputs": inputs,
            "benchmarks": benchmarks,
            "partitions": parts,
            "recipe": {k: v for k, v in dataclasses.asdict(self.recipe).items() if k not in ("workers",)},
        }
        identity = json.loads(json.dumps(identity))
        if self.work.exists("run.json"):
            if self.identity != identity:
                raise PipelineError(
                    f"{self.out} holds a run with other inputs or settings (work/run.json); "
                    "use a new output directory, or delete it to start over"
                )
        else:
            self.work.write_bytes("run.json", json.dumps(identity, indent=1).encode())
            self._identity = identity

    def _resolve(self, patterns: list[str], bench: bool = False) -> list[str]:
        from data_pipeline.readers import expand_inputs
        from data_pipeline.sample_crawl import write_sample

        if patterns == ["sample"]:
            sample = write_sample(self.work.child("sample"))
            return sample["benchmarks"] if bench else sample["crawl"]
        return expand_inputs(patterns, self.recipe.reader) if patterns else []

    @property
    def identity(self) -> dict:
        if self._identity is None:
            self._identity = json.loads(self.work.read("run.json", max_bytes=MAX_RUN_JSON_BYTES))
        return self._identity

    @property
    def inputs(self) -> list[str]:
        return self.identity["inputs"]

    @property
    def benchmarks(self) -> list[str]:
        return self.identity["benchmarks"]

    @property
    def partitions(self) -> int:
        """Hash partitions of the corpus-wide stages: each of their tasks holds one."""
        return self.identity["partitions"]

    def dedup_on(self) -> bool:
        return self.recipe.dedup.exact or self.recipe.dedup.minhash

    def decontam_on(self) -> bool:
        return bool(self.recipe.decontam.enabled and self.benchmarks)

    def markers(self, stage: str, n: int) -> list[dict]:
        """The completion markers of a finished stage (read once per process)."""
        if stage not in self._finished:
            self._finished[stage] = [read_marker(self.work, stage, t) for t in range(n)]
        return self._finished[stage]

    # -- stages ----------------------------------------------------------------------------------
    def stages(self) -> list[tuple[str, int]]:
        """(stage, number of tasks) in order. The clusters rounds are listed as far as they are known:
        the finished ones and the next (a round's outcome decides whether another follows)."""
        from data_pipeline.stages import STAGES

        return [entry for stage in STAGES for entry in stage.plan(self)]

    def run_task(self, stage: str, task: int) -> None:
        from data_pipeline.stages import stage_module

        run_once(self.work, stage, task, lambda: stage_module(stage).run(self, stage, task))

    def card_text(self) -> str:
        """The data card (README.md) of a finished run."""
        return self.store.read("README.md", max_bytes=MAX_RUN_JSON_BYTES).decode()
