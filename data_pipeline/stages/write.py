"""write (one task per input file): its filtered documents minus dedup removals, decontaminated ->
``documents/TTTTT-SSS.jsonl.gz`` (task-unique names; + ``dropped/write-TTTTT.jsonl.gz``)."""

from __future__ import annotations

import io
import json
from typing import Iterator

import numpy as np

from data_pipeline.document import StageStats, Stats, nbytes
from data_pipeline.executors.tasks import JsonlGzWriter
from data_pipeline.pipeline import Pipeline

MAX_REMOVALS_BYTES = 2**30


def plan(pipe: Pipeline) -> list[tuple[str, int]]:
    return [("write", len(pipe.inputs))]


def _filtered(pipe: Pipeline, task: int) -> Iterator[dict]:
    import zstandard

    from data_pipeline.stages.filter import filtered_key

    with pipe.work.open(filtered_key(task)) as raw:
        reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
        for line in reader:
            yield json.loads(line)


class _Shards:
    """Documents into shards of ``docs_per_shard``, named by the task."""

    def __init__(self, pipe: Pipeline, task: int) -> None:
        self.pipe, self.task, self.writer, self.written, self.counts = pipe, task, None, [], []

    def emit(self, record: dict) -> None:
        if self.writer is None or self.writer.count >= self.pipe.recipe.writer.docs_per_shard:
            self.close()
            key = f"documents/{self.task:05d}-{len(self.written):03d}.jsonl.gz"
            self.writer = JsonlGzWriter(self.pipe.store, key)
        self.writer.write(json.dumps(record, ensure_ascii=False))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.written.append(self.writer.key)
            self.counts.append(self.writer.count)
            self.writer = None


def _count(st: StageStats, size: int, reason: str | None) -> None:
    st.seen += 1
    st.bytes_in += size
    if reason is not None:
        st.dropped[reason] += 1
    else:
        st.kept += 1


def run(pipe: Pipeline, name: str, task: int) -> dict:
    from data_pipeline.decontam.ngrams import cut
    from data_pipeline.stages.decontam import bad_ngrams
    from data_pipeline.stages.filter import load_sig
    from data_pipeline.stages.removals import removed_key

    r, stats = pipe.recipe, Stats()
    dedup = np.load(io.BytesIO(pipe.work.read(removed_key(task), max_bytes=MAX_REMOVALS_BYTES)), allow_pickle=False)
    removed = dict(zip(dedup["idx"].tolist(), dedup["exact"].tolist()))
    bad = bad_ngrams(pipe)
    sig = load_sig(pipe, task) if len(bad) else None
    hit_docs = set(sig["hit_doc"][np.isin(sig["hit_hash"], bad)].tolist()) if sig is not None else set()
    dd, dc = stats.stage("dedup"), stats.stage("decontam")
    shards = _Shards(pipe, task)
    dropped = JsonlGzWriter(pipe.store, f"dropped/write-{task:05d}.jsonl.gz") if r.writer.write_dropped else None

    def drop(record: dict, stage: str, reason: str) -> None:
        if dropped is not None:
            dropped.write(json.dumps({**record, "dropped_by": stage, "reason": reason}, ensure_ascii=False))

    for i, record in enumerate(_filtered(pipe, task)):
        size = nbytes(record["text"])
        reason = None if i not in removed else "dedup: exact duplicate" if removed[i] else "dedup: near duplicate"
        _count(dd, size, reason)
        if reason is not None:
            drop(record, "dedup", reason)
            continue
        dd.bytes_kept += size
        pieces = [record["text"]]
        if i in hit_docs:
            pieces, reason = (
                ([], "decontam: contains benchmark text")
                if r.decontam.mode == "drop_document"
                else cut(record["text"], bad, r.decontam)
            )
        _count(dc, size, reason)
        if reason is not None:
            drop(record, "decontam", reason)
            continue
        dc.bytes_kept += sum(nbytes(p) for p in pieces) if i in hit_docs else size
        for k, piece in enumerate(pieces):
            shards.emit(
                {**record, "id": f"{record['id']}#piece{k}", "text": piece, "decontaminated": True}
                if i in hit_docs
                else record
            )
    shards.close()
    if dropped is not None:
        dropped.close()
    return {"stats": stats.to_dict(), "shards": shards.written, "counts": shards.counts}
