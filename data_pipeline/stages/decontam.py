"""decontam (``partitions`` tasks, when benchmarks are given): one hash range of the benchmark n-grams.

Task p counts, for each n-gram of its range, the kept documents that contain it (every removals
task's hits of that range). N-grams in more than ``decontam.max_doc_freq`` documents are ignored
(boilerplate); the others are dirty: their hashes go to the write stage, and the benchmark items
they come from, with the ids of the documents that matched, go into the task's marker, which the
card stage gathers into contamination.json. Bounded by the hits in one range, not by the corpus.
"""

from __future__ import annotations

import numpy as np

from data_pipeline.dedup.shuffle import file_of, position_of, read_routed
from data_pipeline.pipeline import Pipeline
from data_pipeline.stages.removals import HIT, hits_key

MAX_BAD_BYTES = 2**30


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return [("decontam", pipe.partitions if pipe.decontam_on() else 0)]


def bad_key(task: int) -> str:
    return f"decontam/{task:05d}.bad"


def bad_ngrams(pipe: Pipeline) -> np.ndarray:
    """Every dirty n-gram hash, sorted (hash ranges in order, each sorted)."""
    if not pipe.decontam_on():
        return np.zeros(0, np.uint64)
    parts = [np.frombuffer(pipe.work.read(bad_key(p), max_bytes=MAX_BAD_BYTES), "<u8") for p in range(pipe.partitions)]
    return np.concatenate(parts).astype(np.uint64)


def _names(pipe: Pipeline, docs: np.ndarray) -> dict[int, str]:
    """The document id (as written) of each packed id: one signature file read per input file."""
    from data_pipeline.stages.filter import load_sig

    names: dict[int, str] = {}
    for f in np.unique(file_of(docs)):
        ids, mine = load_sig(pipe, int(f))["ids"], docs[file_of(docs) == f]
        names.update({int(d): str(ids[pos]) for d, pos in zip(mine, position_of(mine))})
    return names


def run(pipe: Pipeline, name: str, task: int) -> dict:
    from data_pipeline.stages.benchmarks import load_index

    cfg = pipe.recipe.decontam
    hits, _ = read_routed(pipe.work, [hits_key(t) for t in range(len(pipe.inputs))], task, HIT)
    ngrams, freq = np.unique(hits["hash"], return_counts=True)
    bad = ngrams[freq <= cfg.max_doc_freq]
    pipe.work.write_bytes(bad_key(task), bad.astype("<u8").tobytes())
    dirty = hits[np.isin(hits["hash"], bad)]
    names, index = _names(pipe, dirty["doc"]), load_index(pipe)
    matched: dict[int, set[str]] = {}
    for h, doc in zip(dirty["hash"], dirty["doc"]):
        for item in index.items_of(np.array([h], dtype=np.uint64)):
            matched.setdefault(int(item), set()).add(names[int(doc)])
    return {
        "ignored_frequent_ngrams": int((freq > cfg.max_doc_freq).sum()),
        "dirty_ngrams": int(len(bad)),
        "matched": {str(i): sorted(v) for i, v in sorted(matched.items())},
    }
