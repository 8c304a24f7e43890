"""filter (one task per input file): read -> the recipe's filter steps -> the documents that pass.

Writes, for its input file: the kept documents (``filtered/T.jsonl.zst``), their ids and benchmark
n-gram hits (``sig/T.npz``), and their dedup keys for the buckets stage (``keys/T.band``: one
record per document and band, ``keys/T.exact``: one per document), each grouped by hash range.
"""

from __future__ import annotations

import io

import numpy as np

from data_pipeline.dedup.shuffle import key_partition, write_routed
from data_pipeline.document import Stats
from data_pipeline.executors.tasks import JsonlGzWriter
from data_pipeline.pipeline import Pipeline

BAND = np.dtype([("band", "<u4"), ("key", "<u8"), ("doc", "<u4")])  # doc: position in the input file
EXACT = np.dtype([("k0", "<u8"), ("k1", "<u8"), ("doc", "<u4")])
MAX_SIG_BYTES = 8 * 2**30


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return [("filter", len(pipe.inputs))]


def filtered_key(task: int) -> str:
    return f"filtered/{task:05d}.jsonl.zst"


def sig_key(task: int) -> str:
    return f"sig/{task:05d}.npz"


def load_sig(pipe: Pipeline, task: int):
    return np.load(io.BytesIO(pipe.work.read(sig_key(task), max_bytes=MAX_SIG_BYTES)), allow_pickle=False)


def run(pipe: Pipeline, name: str, task: int) -> dict:
    import zstandard

    from data_pipeline.dedup.minhash import MinHasher, exact_key
    from data_pipeline.filters.steps import apply, build_steps
    from data_pipeline.readers import read
    from data_pipeline.stages.benchmarks import load_index

    r, path, stats = pipe.recipe, pipe.inputs[task], Stats()
    steps = build_steps(r, stats)
    hasher = MinHasher(r.dedup.bands, r.dedup.rows, r.dedup.ngram, r.dedup.seed) if r.dedup.minhash else None
    index = load_index(pipe)
    ids, exact, bands, hit_doc, hit_hash = [], [], [], [], []
    dropped = JsonlGzWriter(pipe.store, f"dropped/filter-{task:05d}.jsonl.gz") if r.writer.write_dropped else None
    with (
        pipe.work.open_write(filtered_key(task)) as raw,
        zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False) as zw,
    ):
        for doc in read(path, r.reader, stats):
            reason, stage = apply(doc, steps, stats, path)
            if reason is not None:
                if dropped is not None:
                    dropped.write(doc.to_json(dropped_by=stage, reason=reason))
                continue
            n = len(ids)
            ids.append(doc.id)
            zw.write((doc.to_json() + "\n").encode("utf-8", "surrogatepass"))
            if r.dedup.exact:
                exact.append(exact_key(doc.text))
            if hasher is not None:
                bands.append(hasher.band_keys(hasher.signature(doc.text)))
            if index is not None:
                h = index.hits(doc.text, r.decontam.n)
                hit_doc.append(np.full(len(h), n, dtype=np.int64))
                hit_hash.append(h)
    if dropped is not None:
        dropped.close()
    buf = io.BytesIO()
    np.savez(
        buf,
        ids=np.array(ids, dtype=str),
        hit_doc=np.concatenate(hit_doc) if hit_doc else np.zeros(0, np.int64),
        hit_hash=np.concatenate(hit_hash) if hit_hash else np.zeros(0, np.uint64),
    )
    pipe.work.write_bytes(sig_key(task), buf.getvalue())
    _write_keys(
        pipe,
        task,
        np.array(bands, dtype=np.uint64).reshape(len(bands), r.dedup.bands),
        np.array(exact, dtype=np.uint64).reshape(-1, 2),
    )
    return {"stats": stats.to_dict(), "documents": len(ids), "input": path}


def _write_keys(pipe: Pipeline, task: int, bands: np.ndarray, exact: np.ndarray) -> None:
    """Band keys (documents x bands) and exact keys (documents x 2), grouped by hash range."""
    parts = pipe.partitions
    n, b = bands.shape
    band = np.empty(n * b, BAND)
    band["band"] = np.tile(np.arange(b, dtype=np.uint32), n)
    band["key"] = bands.ravel()
    band["doc"] = np.repeat(np.arange(n, dtype=np.uint32), b)
    write_routed(pipe.work, f"keys/{task:05d}.band", band, key_partition(band["key"], parts), parts)
    ex = np.empty(len(exact), EXACT)
    ex["k0"], ex["k1"], ex["doc"] = exact[:, 0], exact[:, 1], np.arange(len(exact), dtype=np.uint32)
    write_routed(pipe.work, f"keys/{task:05d}.exact", ex, key_partition(ex["k0"], parts), parts)
