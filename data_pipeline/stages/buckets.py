"""buckets (``partitions`` tasks): documents that share a key -> candidate pairs.

Task p holds hash range p of every LSH band's keys and of the exact keys (read from every filter
task's ``keys/`` files), never a whole band. Each group of documents with the same (band, key), or
the same exact key, becomes a star: (first document, other member). The pairs go to the first
clusters round, both directions, grouped by the node partition of their first id; the exact groups
also go to the removals stage, as (member, first document of its exact group), grouped by input file.
"""

from __future__ import annotations

import numpy as np

from data_pipeline.dedup.components import unique_pairs
from data_pipeline.dedup.shuffle import file_of, node_partition, read_routed, write_routed
from data_pipeline.pipeline import Pipeline
from data_pipeline.stages.filter import BAND, EXACT


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return [("buckets", pipe.partitions if pipe.dedup_on() else 0)]


def edges_key(task: int) -> str:
    return f"buckets/{task:05d}.edges"


def exact_key(task: int) -> str:
    return f"buckets/{task:05d}.exact"


def star_edges(keys: list[np.ndarray], ids: np.ndarray) -> np.ndarray:
    """(first id, member) for every other member of each group of equal ``keys`` (compared together)."""
    if len(ids) < 2:
        return np.zeros((0, 2), np.int64)
    order = np.lexsort((ids, *keys[::-1]))
    k, i = [key[order] for key in keys], ids[order]
    new = np.ones(len(i), bool)
    new[1:] = np.logical_or.reduce([key[1:] != key[:-1] for key in k])
    first = i[new][np.cumsum(new) - 1]
    return np.stack([first[~new], i[~new]], axis=1)


def _ids(files: np.ndarray, counts: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return (np.repeat(files, counts) << np.int64(32)) | positions.astype(np.int64)


def run(pipe: Pipeline, name: str, task: int) -> dict:
    d, files = pipe.recipe.dedup, np.arange(len(pipe.inputs), dtype=np.int64)
    pairs, exact_pairs, keys = [], np.zeros((0, 2), np.int64), 0
    if d.minhash:
        band, counts = read_routed(pipe.work, [f"keys/{t:05d}.band" for t in files], task, BAND)
        keys += len(band)
        pairs.append(star_edges([band["band"], band["key"]], _ids(files, counts, band["doc"])))
        del band
    if d.exact:
        ex, counts = read_routed(pipe.work, [f"keys/{t:05d}.exact" for t in files], task, EXACT)
        keys += len(ex)
        exact_pairs = star_edges([ex["k0"], ex["k1"]], _ids(files, counts, ex["doc"]))
        pairs.append(exact_pairs)
        del ex
    edges = unique_pairs(np.concatenate(pairs)) if pairs else np.zeros((0, 2), np.int64)
    both = np.concatenate([edges, edges[:, ::-1]])
    write_routed(pipe.work, edges_key(task), both, node_partition(both[:, 0], pipe.partitions), pipe.partitions)
    member_first = np.ascontiguousarray(exact_pairs[:, ::-1])
    write_routed(pipe.work, exact_key(task), member_first, file_of(member_first[:, 0]), len(files))
    return {"keys": int(keys), "pairs": int(len(edges)), "exact_pairs": int(len(exact_pairs))}
