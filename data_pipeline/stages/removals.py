"""removals (one task per input file): which of its documents dedup removes, and the benchmark hits
of the others.

A document is removed when it is not the first (input order) of its component: the last clusters
round gave each such document that first document. It counts as an exact duplicate when the first
document of its component is also the first of its exact-key group (the buckets stage gave each
member of an exact group its group's first document), i.e. when its text equals the kept one's,
and as a near duplicate otherwise. The benchmark n-gram hits of kept documents go to the decontam
stage, grouped by n-gram hash range.
"""

from __future__ import annotations

import io

import numpy as np

from data_pipeline.dedup.shuffle import (
    EDGE,
    as_edges,
    key_partition,
    packed_ids,
    position_of,
    read_routed,
    write_routed,
)
from data_pipeline.pipeline import Pipeline

HIT = np.dtype([("hash", "<u8"), ("doc", "<i8")])  # a benchmark n-gram in a kept document (packed id)


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return [("removals", len(pipe.inputs))]


def removed_key(task: int) -> str:
    return f"dedup/{task:05d}.npz"


def hits_key(task: int) -> str:
    return f"removals/{task:05d}.hits"


def removed(pipe: Pipeline, task: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions of the removed documents, sorted; whether each is an exact duplicate)."""
    from data_pipeline.stages.buckets import exact_key
    from data_pipeline.stages.clusters import rounds

    if not pipe.dedup_on():
        return np.zeros(0, np.int64), np.zeros(0, bool)
    labels = as_edges(read_routed(pipe.work, rounds(pipe).labels(), task, EDGE)[0])  # (member, first)
    order = np.argsort(labels[:, 0], kind="stable")
    idx, first = position_of(labels[order, 0]), labels[order, 1]
    exact_first = packed_ids(task, n)  # a document alone in its exact group is its group's first
    if pipe.recipe.dedup.exact:
        groups = as_edges(read_routed(pipe.work, [exact_key(p) for p in range(pipe.partitions)], task, EDGE)[0])
        exact_first[position_of(groups[:, 0])] = groups[:, 1]
        return idx, exact_first[idx] == first
    return idx, np.zeros(len(idx), bool)


def run(pipe: Pipeline, name: str, task: int) -> dict:
    from data_pipeline.executors.tasks import read_marker
    from data_pipeline.stages.filter import load_sig

    n = read_marker(pipe.work, "filter", task)["documents"]
    idx, exact = removed(pipe, task, n)
    buf = io.BytesIO()
    np.savez(buf, idx=idx, exact=exact)
    pipe.work.write_bytes(removed_key(task), buf.getvalue())
    if pipe.decontam_on():
        sig = load_sig(pipe, task)
        kept = ~np.isin(sig["hit_doc"], idx)
        hits = np.empty(int(kept.sum()), HIT)
        hits["hash"], hits["doc"] = sig["hit_hash"][kept], packed_ids(task, n)[sig["hit_doc"][kept]]
        write_routed(pipe.work, hits_key(task), hits, key_partition(hits["hash"], pipe.partitions), pipe.partitions)
    return {
        "documents": n,
        "removed": int(len(idx)),
        "exact_removed": int(exact.sum()),
        "near_removed": int((~exact).sum()),
    }
