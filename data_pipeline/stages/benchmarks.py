"""benchmarks (one task): the benchmark files -> the n-gram index every filter task looks documents up in
(bounded by the benchmarks' size, not the crawl's)."""

from __future__ import annotations

from data_pipeline.document import Stats
from data_pipeline.pipeline import Pipeline

INDEX = "benchmarks/index"


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return [("benchmarks", 1)]


def run(pipe: Pipeline, name: str, task: int) -> dict:
    from data_pipeline.decontam.ngrams import build_index

    stats = Stats()
    index = build_index(pipe.benchmarks, pipe.recipe.decontam, stats) if pipe.decontam_on() else None
    if index is not None:
        index.save(pipe.work, INDEX)
    return {"stats": stats.to_dict(), "items": len(index.items) if index else 0}


def load_index(pipe: Pipeline):
    """The benchmark index, or None when decontamination is off."""
    from data_pipeline.decontam.ngrams import BenchmarkIndex

    return BenchmarkIndex.load(pipe.work, INDEX) if pipe.decontam_on() else None
