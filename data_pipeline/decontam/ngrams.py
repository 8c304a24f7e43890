"""Benchmark decontamination: GPT-3 appendix C / lm-eval-harness's "Janitor", Dolma as an option.

Benchmark items and training documents are compared on word 13-grams of text lowercased with
punctuation removed. The benchmark side is one sorted array of n-gram hashes (plus which items
each came from); each training document's n-grams are looked up with one ``searchsorted``. The
reduce step ignores n-grams found in more than ``max_doc_freq`` training documents (boilerplate),
marks the benchmark items that still collide as dirty, and the write step cuts every colliding
n-gram out of its document with ``margin_chars`` on each side, drops pieces shorter than
``min_piece_chars`` and drops documents cut into more than ``max_pieces`` pieces (mode ``cut``), or
drops the whole document (mode ``drop_document``, Dolma).
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass

import numpy as np

from data_pipeline.dedup.hashing import normalize, window_hashes
from data_pipeline.document import Stats
from data_pipeline.readers.streams import max_record_bytes, open_stream, read_line
from data_pipeline.recipe import DecontamCfg, ReaderCfg
from data_pipeline.remote import open_url
from glm_common.storage import Storage

TOKEN = re.compile(r"\S+")
MAX_INDEX_BYTES = 4 * 2**30  # the n-gram index of the benchmarks (tens of MB for all of lm-eval's)


def doc_ngrams(text: str, n: int) -> np.ndarray:
    return window_hashes(normalize(text, "janitor"), n, short=False)


@dataclass
class BenchmarkIndex:
    hashes: np.ndarray  # sorted unique n-gram hashes of all items
    pair_hash: np.ndarray  # (hash, item) pairs sorted by hash
    pair_item: np.ndarray
    items: list[dict]  # {"benchmark", "item", "words"}

    def hits(self, text: str, n: int) -> np.ndarray:
        """The distinct benchmark n-gram hashes that occur in ``text``."""
        if len(self.hashes) == 0:
            return np.zeros(0, dtype=np.uint64)
        grams = doc_ngrams(text, n)
        pos = np.searchsorted(self.hashes, grams)
        pos[pos == len(self.hashes)] = 0
        return np.unique(grams[self.hashes[pos] == grams])

    def items_of(self, hashes: np.ndarray) -> np.ndarray:
        lo = np.searchsorted(self.pair_hash, hashes, side="left")
        hi = np.searchsorted(self.pair_hash, hashes, side="right")
        return np.unique(np.concatenate([self.pair_item[a:b] for a, b in zip(lo, hi)] or [np.zeros(0, np.int64)]))

    def save(self, store: Storage, key: str) -> None:
        buf = io.BytesIO()
        np.savez(buf, hashes=self.hashes, pair_hash=self.pair_hash, pair_item=self.pair_item)
        store.write_bytes(key + ".npz", buf.getvalue())
        store.write_bytes(key + ".items.json", json.dumps(self.items).encode())

    @classmethod
    def load(cls, store: Storage, key: str) -> "BenchmarkIndex":
        z = np.load(io.BytesIO(store.read(key + ".npz", max_bytes=MAX_INDEX_BYTES)), allow_pickle=False)
        items = json.loads(store.read(key + ".items.json", max_bytes=MAX_INDEX_BYTES))
        return cls(z["hashes"], z["pair_hash"], z["pair_item"], items)


def build_index(files: list[str], cfg: DecontamCfg, stats: Stats) -> BenchmarkIndex:
    """Read benchmark items (JSONL or Parquet); an item's text is its configured fields joined, and
    it is known by its file and line (row) and, when it has one, its ``id`` field.
    An item with none of the fields is reported (file, line) and skipped; an item shorter than
    ``n`` words cannot be checked and is counted as such."""
    items, hashes, owners = [], [], []
    for path in files:
        bench = os.path.basename(path).split(".")[0]
        for lineno, record in _records(path, stats):
            parts = [_as_text(record.get(f)) for f in cfg.fields if f in record]
            parts = [p for p in parts if p]
            if not parts:
                stats.error(
                    "benchmark item without any configured field",
                    path,
                    lineno,
                    f"fields {cfg.fields}; the item has {sorted(record)[:12]}",
                )
                continue
            text = "\n".join(parts)
            grams = np.unique(doc_ngrams(text, cfg.n))
            items.append(
                {
                    "benchmark": bench,
                    "item": lineno,
                    "id": _item_id(record),
                    "words": len(normalize(text, "janitor").split()),
                }
            )
            if len(grams) == 0:
                stats.error(
                    "benchmark item shorter than n words", path, lineno, f"fewer than {cfg.n} words: not checkable"
                )
                continue
            hashes.append(grams)
            owners.append(np.full(len(grams), len(items) - 1, dtype=np.int64))
    pair_hash = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    pair_item = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    order = np.argsort(pair_hash, kind="stable")
    return BenchmarkIndex(np.unique(pair_hash), pair_hash[order], pair_item[order], items)


def _records(path: str, stats: Stats, cfg: ReaderCfg = ReaderCfg()):
    """Benchmark items with their row or line number; lines bounded by ``reader.max_record_mb``."""
    if ".parquet" in path:
        import pyarrow.parquet as pq

        with open_url(path, "rb") as f:
            for row, record in enumerate(pq.read_table(f).to_pylist(), 1):
                yield row, record
        return
    f, close, _ = open_stream(path, cfg)
    try:
        lineno = 0
        while True:
            line, _ = read_line(f, max_record_bytes(cfg))
            lineno += 1
            if line == b"":
                return
            if line is None:
                stats.error("malformed benchmark line", path, lineno, f"longer than {cfg.max_record_mb:g} MB")
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                stats.error("malformed benchmark line", path, lineno, str(err))
                continue
            if isinstance(record, dict):
                yield lineno, record
            else:
                stats.error("malformed benchmark line", path, lineno, "not a JSON object")
    finally:
        close()


def _item_id(record: dict) -> str | None:
    """The item's own ``id`` field (what ``glm eval --contamination`` matches), when it has one."""
    value = record.get("id")
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _as_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(v for v in value if isinstance(v, str))
    return ""


def cut(text: str, bad: np.ndarray, cfg: DecontamCfg) -> tuple[list[str], str | None]:
    """Remove every n-gram whose hash is in ``bad`` (sorted) with ``margin_chars`` each side.
    Returns the kept pieces and a drop reason (None if pieces survive)."""
    spans = [(m.start(), m.end()) for m in TOKEN.finditer(text)]
    norm = [normalize(text[a:b], "janitor").strip() for a, b in spans]
    keep = [i for i, t in enumerate(norm) if t]
    words = b" ".join(norm[i] for i in keep)
    grams = window_hashes(words, cfg.n, short=False)
    pos = np.searchsorted(bad, grams)
    pos[pos == len(bad)] = 0
    hit = np.flatnonzero(bad[pos] == grams) if len(bad) else np.zeros(0, np.int64)
    cuts = []
    for g in hit:
        start, end = spans[keep[g]][0], spans[keep[g + cfg.n - 1]][1]
        cuts.append((max(0, start - cfg.margin_chars), min(len(text), end + cfg.margin_chars)))
    pieces, at = [], 0
    for a, b in sorted(cuts):
        if a > at:
            pieces.append(text[at:a])
        at = max(at, b)
    if at < len(text):
        pieces.append(text[at:])
    if len(pieces) > cfg.max_pieces:
        return [], f"decontam: cut into more than {cfg.max_pieces} pieces"
    pieces = [p.strip() for p in pieces if len(p.strip()) >= cfg.min_piece_chars]
    if not pieces:
        return [], "decontam: nothing left after cutting"
    return pieces, None
