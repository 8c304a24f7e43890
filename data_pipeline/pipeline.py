"""``glm data run``: raw crawl -> filtered, deduplicated, decontaminated JSONL shards + data card.

Stages, each a set of independent tasks (see ``executors/``):

  benchmarks (1)        benchmark files -> n-gram index
  filter (per input)    read -> url -> extract -> language -> quality rules; keeps documents in a
                        work file with their exact key, MinHash band keys and benchmark n-gram hits
  buckets (per band)    documents sharing a key -> edges (one task per LSH band + one for exact keys)
  clusters (1)          connected components -> which documents each task removes; n-grams frequent
                        in the corpus are ignored; dirty benchmark items -> contamination.json
  write (per input)     dedup removals + decontamination -> documents/*.jsonl.gz (+ dropped/)
  card (1)              stats.json, data card (README.md) and funnel.png

Everything a task writes appears atomically and a completion marker comes last, so a rerun
after a crash or preemption skips finished tasks and produces the same bytes.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import traceback
from typing import Callable, Iterator

import numpy as np

from data_pipeline.document import Document, Stats, nbytes
from data_pipeline.executors.tasks import JsonlGzWriter, atomic_open, atomic_write_bytes, is_done, read_marker, write_marker
from data_pipeline.recipe import Recipe

log = logging.getLogger(__name__)
STAGE_ORDER = ("benchmarks", "filter", "buckets", "clusters", "write", "card")


class PipelineError(RuntimeError):
    """A run that cannot start or continue (the message says what to fix)."""


class Pipeline:
    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.out = os.path.abspath(recipe.output)
        self.work = os.path.join(self.out, "work")
        self._inputs: list[str] | None = None
        self._benchmarks: list[str] | None = None

    # -- setup ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Resolve the inputs (materialising the embedded sample crawl if asked) and freeze them
        with the recipe in work/run.json; a later run in the same output must match."""
        inputs, benchmarks = self._resolve(self.recipe.input), self._resolve(self.recipe.benchmarks, bench=True)
        os.makedirs(self.work, exist_ok=True)
        identity = {"inputs": inputs, "benchmarks": benchmarks,
                    "recipe": {k: v for k, v in dataclasses.asdict(self.recipe).items() if k not in ("workers",)}}
        path = os.path.join(self.work, "run.json")
        if os.path.exists(path):
            with open(path) as f:
                previous = json.load(f)
            if previous != json.loads(json.dumps(identity)):
                raise PipelineError(f"{self.out} holds a run with other inputs or settings (work/run.json); "
                                    "use a new output directory, or delete it to start over")
        else:
            atomic_write_bytes(path, json.dumps(identity, indent=1).encode())

    def _resolve(self, patterns: list[str], bench: bool = False) -> list[str]:
        from data_pipeline.readers import expand_inputs
        from data_pipeline.sample_crawl import write_sample

        if patterns == ["sample"]:
            sample = write_sample(os.path.join(self.work, "sample"))
            return sample["benchmarks"] if bench else sample["crawl"]
        return expand_inputs(patterns) if patterns else []

    def _identity(self) -> dict:
        with open(os.path.join(self.work, "run.json")) as f:
            return json.load(f)

    @property
    def inputs(self) -> list[str]:
        if self._inputs is None:
            self._inputs = self._identity()["inputs"]
        return self._inputs

    @property
    def benchmarks(self) -> list[str]:
        if self._benchmarks is None:
            self._benchmarks = self._identity()["benchmarks"]
        return self._benchmarks

    def n_bucket_tasks(self) -> int:
        d = self.recipe.dedup
        return (d.bands if d.minhash else 0) + (1 if d.exact else 0)

    def stages(self) -> list[tuple[str, int]]:
        n = len(self.inputs)
        return [("benchmarks", 1), ("filter", n), ("buckets", self.n_bucket_tasks()), ("clusters", 1),
                ("write", n), ("card", 1)]

    def run_task(self, stage: str, task: int) -> None:
        if is_done(self.work, stage, task):
            return
        fn: Callable[[int], dict] = getattr(self, f"_task_{stage}")
        result = fn(task)
        write_marker(self.work, stage, task, result)

    def path(self, *parts: str) -> str:
        return os.path.join(self.work, *parts)

    # -- benchmarks ------------------------------------------------------------------------------
    def _task_benchmarks(self, task: int) -> dict:
        from data_pipeline.decontam.ngrams import build_index

        stats = Stats()
        index = build_index(self.benchmarks, self.recipe.decontam, stats) if self._decontam_on() else None
        if index is not None:
            os.makedirs(self.path("benchmarks"), exist_ok=True)
            index.save(self.path("benchmarks", "index"))
        return {"stats": stats.to_dict(), "items": len(index.items) if index else 0}

    def _decontam_on(self) -> bool:
        return bool(self.recipe.decontam.enabled and self.benchmarks)

    def _index(self):
        from data_pipeline.decontam.ngrams import BenchmarkIndex

        return BenchmarkIndex.load(self.path("benchmarks", "index")) if self._decontam_on() else None

    # -- filter ----------------------------------------------------------------------------------
    def _task_filter(self, task: int) -> dict:
        import zstandard

        from data_pipeline.dedup.minhash import MinHasher, exact_key
        from data_pipeline.readers import read

        r = self.recipe
        path = self.inputs[task]
        stats = Stats()
        steps = self._filter_steps(stats)
        hasher = MinHasher(r.dedup.bands, r.dedup.rows, r.dedup.ngram, r.dedup.seed) if r.dedup.minhash else None
        index = self._index()
        ids, exact, bands, hit_doc, hit_hash = [], [], [], [], []
        dropped = JsonlGzWriter(os.path.join(self.out, "dropped", f"filter-{task:05d}.jsonl.gz")) if r.writer.write_dropped else None
        out_path = self.path("filtered", f"{task:05d}.jsonl.zst")
        with atomic_open(out_path) as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False) as zw:
            for doc in read(path, r.reader, stats):
                reason, stage = self._apply(doc, steps, stats, path)
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
        with atomic_open(self.path("sig", f"{task:05d}.npz")) as f:
            np.savez(f, ids=np.array(ids, dtype=str),
                     exact=np.array(exact, dtype=np.uint64).reshape(-1, 2),
                     bands=np.array(bands, dtype=np.uint64).reshape(len(bands), -1 if bands else r.dedup.bands),
                     hit_doc=np.concatenate(hit_doc) if hit_doc else np.zeros(0, np.int64),
                     hit_hash=np.concatenate(hit_hash) if hit_hash else np.zeros(0, np.uint64))
        return {"stats": stats.to_dict(), "documents": len(ids), "input": path}

    def _filter_steps(self, stats: Stats) -> list[tuple[str, Callable[[Document], str | None]]]:
        from data_pipeline.filters import quality
        from data_pipeline.filters.language import identify
        from data_pipeline.filters.url import UrlFilter
        from data_pipeline.extract.html import extract

        r = self.recipe
        steps: list[tuple[str, Callable[[Document], str | None]]] = []

        def text_rule(fn, cfg, *extra):
            def step(doc: Document) -> str | None:
                reason, text = fn(doc.text, cfg, *extra)
                if reason is None:
                    doc.text = text
                return reason
            return step

        for name in r.stages:
            if name == "url" and r.url.enabled:
                url_filter = UrlFilter(r.url)
                steps.append((name, lambda doc: url_filter(doc.meta.get("url"))))
            elif name == "extract" and r.extract.enabled:
                steps.append((name, lambda doc: extract(doc, r.extract) if doc.payload is not None else None))
            elif name == "language" and r.language.enabled:
                def language(doc: Document) -> str | None:
                    lang, score = identify(doc.text, r.language.max_chars)
                    doc.meta["language"], doc.meta["language_score"] = lang, round(score, 4)
                    stats.languages[lang] += 1
                    if r.language.languages and lang not in r.language.languages:
                        return f"language: {lang}"
                    if score < r.language.threshold:
                        return f"language: score below {r.language.threshold:g}"
                    return None
                steps.append((name, language))
            elif name == "gopher_repetition" and r.gopher_repetition.enabled:
                steps.append((name, text_rule(quality.gopher_repetition, r.gopher_repetition)))
            elif name == "gopher_quality" and r.gopher_quality.enabled:
                steps.append((name, text_rule(quality.gopher_quality, r.gopher_quality)))
            elif name == "c4" and r.c4.enabled:
                steps.append((name, text_rule(quality.c4, r.c4, quality.load_bad_words(r.c4.bad_words_file))))
            elif name == "fineweb" and r.fineweb.enabled:
                steps.append((name, text_rule(quality.fineweb, r.fineweb)))
            elif name == "classifier" and r.classifier.enabled:
                from data_pipeline.filters.classifier import QualityClassifier

                clf = QualityClassifier.load(r.classifier.model)
                steps.append((name, lambda doc: clf.decide(doc, r.classifier.alpha, r.classifier.seed)))
        return steps

    @staticmethod
    def _apply(doc: Document, steps, stats: Stats, path: str) -> tuple[str | None, str | None]:
        size = len(doc.payload) if doc.payload is not None else nbytes(doc.text)
        for name, step in steps:
            st = stats.stage(name)
            st.seen += 1
            st.bytes_in += size
            text = doc.text
            try:
                reason = step(doc)
            except Exception as err:  # one bad page must not end a long job: count it and go on
                stats.error(f"{name}: {type(err).__name__}", path, None, f"{doc.id}: {err}\n{traceback.format_exc(limit=3)}")
                reason = f"{name}: processing error ({type(err).__name__})"
            if reason is not None:
                st.dropped[reason] += 1
                doc.payload = None
                return reason, name
            st.kept += 1
            if doc.payload is None and doc.text is not text:
                size = nbytes(doc.text)  # measured again only when a stage changed the text
            st.bytes_kept += size
        return None, None

    # -- dedup map/reduce ------------------------------------------------------------------------
    def _sig(self, task: int):
        return np.load(self.path("sig", f"{task:05d}.npz"))

    def _offsets(self) -> np.ndarray:
        counts = [read_marker(self.work, "filter", t)["documents"] for t in range(len(self.inputs))]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def _task_buckets(self, task: int) -> dict:
        from data_pipeline.dedup.minhash import edges_from_keys

        d = self.recipe.dedup
        offsets = self._offsets()
        keys, ids = [], []
        for t in range(len(self.inputs)):
            z = self._sig(t)
            column = z["bands"][:, task] if (d.minhash and task < d.bands) else z["exact"]
            keys.append(column)
            ids.append(np.arange(offsets[t], offsets[t + 1]))
        kind = "band" if (d.minhash and task < d.bands) else "exact"
        k = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        edges = edges_from_keys(k, np.concatenate(ids) if ids else np.zeros(0, np.int64))
        with atomic_open(self.path("edges", f"{task:05d}.npy")) as f:
            np.save(f, edges)
        return {"kind": kind, "edges": int(len(edges))}

    def _task_clusters(self, task: int) -> dict:
        from data_pipeline.dedup.minhash import components

        offsets = self._offsets()
        total = int(offsets[-1])
        edges = [np.load(self.path("edges", f"{k:05d}.npy")) for k in range(self.n_bucket_tasks())]
        rep = components(total, np.concatenate(edges) if edges else np.zeros((0, 2), np.int64))
        removed = rep != np.arange(total)
        exact = np.concatenate([self._sig(t)["exact"] for t in range(len(self.inputs))]) if self.recipe.dedup.exact else None
        same_text = np.all(exact == exact[rep], axis=1) if exact is not None and total else np.zeros(total, bool)
        for t in range(len(self.inputs)):
            lo, hi = offsets[t], offsets[t + 1]
            idx = np.flatnonzero(removed[lo:hi])
            with atomic_open(self.path("dedup", f"{t:05d}.npz")) as f:
                np.savez(f, idx=idx, exact=same_text[lo:hi][idx])
        result = {"documents": total, "clusters_with_duplicates": int(len(np.unique(rep[removed]))),
                  "exact_removed": int((removed & same_text).sum()), "near_removed": int((removed & ~same_text).sum())}
        result["contamination"] = self._contamination(offsets, removed)
        return result

    def _contamination(self, offsets: np.ndarray, removed: np.ndarray) -> dict:
        index = self._index()
        if index is None:
            atomic_write_bytes(self.path("decontam_bad.npy"), b"")
            return {}
        docs, hashes, names = [], [], []
        for t in range(len(self.inputs)):
            z = self._sig(t)
            keep = ~removed[offsets[t] + z["hit_doc"]] if len(z["hit_doc"]) else np.zeros(0, bool)
            docs.append(offsets[t] + z["hit_doc"][keep])
            hashes.append(z["hit_hash"][keep])
            names.append(z["ids"])
        all_docs, all_hashes = np.concatenate(docs), np.concatenate(hashes)
        uniq, freq = np.unique(all_hashes, return_counts=True)
        bad = uniq[freq <= self.recipe.decontam.max_doc_freq]
        ignored = uniq[freq > self.recipe.decontam.max_doc_freq]
        with atomic_open(self.path("decontam_bad.npy")) as f:
            np.save(f, bad)
        id_of = np.concatenate(names) if names else np.zeros(0, str)
        report: dict = {"n": self.recipe.decontam.n, "mode": self.recipe.decontam.mode,
                        "ignored_frequent_ngrams": int(len(ignored)), "benchmarks": {}}
        for item in index.items:
            b = report["benchmarks"].setdefault(item["benchmark"], {"items": 0, "checkable": 0, "dirty": 0,
                                                                     "dirty_items": [], "matched_documents": {}})
            b["items"] += 1
            b["checkable"] += item["words"] >= self.recipe.decontam.n
        is_bad = np.isin(all_hashes, bad)
        for h, doc in zip(all_hashes[is_bad], all_docs[is_bad]):
            for i in index.items_of(np.array([h], dtype=np.uint64)):
                item = index.items[i]
                b = report["benchmarks"][item["benchmark"]]
                b["matched_documents"].setdefault(str(item["item"]), set()).add(str(id_of[doc]))
        for b in report["benchmarks"].values():
            b["matched_documents"] = {k: sorted(v) for k, v in sorted(b["matched_documents"].items(), key=lambda kv: int(kv[0]))}
            b["dirty_items"] = [int(k) for k in b["matched_documents"]]
            b["dirty"] = len(b["dirty_items"])
            b["clean"] = b["items"] - b["dirty"]
        atomic_write_bytes(os.path.join(self.out, "contamination.json"), json.dumps(report, indent=1).encode())
        return {k: {"items": v["items"], "dirty": v["dirty"]} for k, v in report["benchmarks"].items()}

    # -- write -----------------------------------------------------------------------------------
    def _filtered(self, task: int) -> Iterator[dict]:
        import io

        import zstandard

        with open(self.path("filtered", f"{task:05d}.jsonl.zst"), "rb") as raw:
            reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
            for line in reader:
                yield json.loads(line)

    def _task_write(self, task: int) -> dict:
        from data_pipeline.decontam.ngrams import cut

        r = self.recipe
        stats = Stats()
        dedup = np.load(self.path("dedup", f"{task:05d}.npz"))
        removed = dict(zip(dedup["idx"].tolist(), dedup["exact"].tolist()))
        bad = np.load(self.path("decontam_bad.npy")) if self._decontam_on() else np.zeros(0, np.uint64)
        sig = self._sig(task)
        hit_docs = set(sig["hit_doc"][np.isin(sig["hit_hash"], bad)].tolist()) if len(bad) else set()
        dd, dc = stats.stage("dedup"), stats.stage("decontam")
        shard, writer, written = 0, None, []
        dropped = JsonlGzWriter(os.path.join(self.out, "dropped", f"write-{task:05d}.jsonl.gz")) if r.writer.write_dropped else None

        def emit(record: dict) -> None:
            nonlocal shard, writer
            if writer is None or writer.count >= r.writer.docs_per_shard:
                if writer is not None:
                    writer.close()
                    written.append(writer.path)
                    shard += 1
                writer = JsonlGzWriter(os.path.join(self.out, "documents", f"{task:05d}-{shard:03d}.jsonl.gz"))
            writer.write(json.dumps(record, ensure_ascii=False))

        for i, record in enumerate(self._filtered(task)):
            size = nbytes(record["text"])
            dd.seen += 1
            dd.bytes_in += size
            if i in removed:
                reason = "dedup: exact duplicate" if removed[i] else "dedup: near duplicate"
                dd.dropped[reason] += 1
                if dropped is not None:
                    dropped.write(json.dumps({**record, "dropped_by": "dedup", "reason": reason}, ensure_ascii=False))
                continue
            dd.kept += 1
            dd.bytes_kept += size
            dc.seen += 1
            dc.bytes_in += size
            if i in hit_docs:
                if r.decontam.mode == "drop_document":
                    pieces, reason = [], "decontam: contains benchmark text"
                else:
                    pieces, reason = cut(record["text"], bad, r.decontam)
                if reason is not None:
                    dc.dropped[reason] += 1
                    if dropped is not None:
                        dropped.write(json.dumps({**record, "dropped_by": "decontam", "reason": reason}, ensure_ascii=False))
                    continue
                dc.kept += 1
                for k, piece in enumerate(pieces):
                    dc.bytes_kept += nbytes(piece)
                    emit({**record, "id": f"{record['id']}#piece{k}", "text": piece, "decontaminated": True})
                continue
            dc.kept += 1
            dc.bytes_kept += size
            emit(record)
        if writer is not None:
            writer.close()
            written.append(writer.path)
        if dropped is not None:
            dropped.close()
        return {"stats": stats.to_dict(), "shards": [os.path.relpath(p, self.out) for p in written]}

    # -- card ------------------------------------------------------------------------------------
    def _task_card(self, task: int) -> dict:
        from data_pipeline.card import write_card

        merged = Stats()
        for stage in ("benchmarks", "filter", "write"):
            n = 1 if stage == "benchmarks" else len(self.inputs)
            for t in range(n):
                merged.merge(Stats.from_dict(read_marker(self.work, stage, t)["stats"]))
        clusters = read_marker(self.work, "clusters", 0)
        shards = [s for t in range(len(self.inputs)) for s in read_marker(self.work, "write", t)["shards"]]
        write_card(self.out, self.recipe, merged, clusters, shards, self.inputs, self.benchmarks)
        return {"shards": len(shards)}
