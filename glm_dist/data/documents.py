"""The deterministic order of a split's documents in each epoch, computed from the document table.

Order: the shards are permuted by (seed, epoch) and taken ``window`` at a time; the documents of
the shards in a window are pooled and permuted by (seed, epoch, the window's shards) -- the order
the streaming loader had, so objectives pack the same units. Nothing here reads a shard: a window's
documents and their lengths come from the table, computed when first asked for and kept for a
while. An epoch is also a *stream* of positions: each document contributes its tokens plus
``extra`` positions (a separator), so position p of epoch e names one document and one token of
it -- what the packing plans (data/plan.py) address units by.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from glm_dist.data.index import DocTable

WINDOW_CACHE = 256  # windows whose document order and cumulative lengths are kept


class DocumentOrder:
    def __init__(self, table: DocTable, *, seed: int, shuffle: bool = True, window: int = 1):
        self.table, self.seed, self.shuffle, self.window = table, seed, shuffle, window
        usable = table.usable
        counts = np.diff(table.shard_start)
        self.shard_docs = np.where(usable, counts, 0)
        self.shard_tokens = np.where(usable, table.shard_tokens, 0)
        self.window_docs = lru_cache(maxsize=WINDOW_CACHE)(self._window_docs)
        self.window_cum = lru_cache(maxsize=WINDOW_CACHE)(self._window_cum)
        self.window_sizes = lru_cache(maxsize=8)(self._window_sizes)
        self.windows = lru_cache(maxsize=4)(self._windows)

    @property
    def num_docs(self) -> int:
        return int(self.shard_docs.sum())

    def tokens(self, extra: int = 0) -> int:
        """Positions in one epoch: every usable document's tokens plus ``extra`` each."""
        return int(self.shard_tokens.sum()) + extra * self.num_docs

    def shard_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.table.num_shards)
        return np.random.default_rng([self.seed, epoch]).permutation(self.table.num_shards)

    def _windows(self, epoch: int) -> tuple[tuple[int, ...], ...]:
        order = [int(i) for i in self.shard_order(epoch)]
        return tuple(tuple(order[i : i + self.window]) for i in range(0, len(order), self.window))

    def doc_order(self, epoch: int, shards: tuple[int, ...], num_docs: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(num_docs)
        return np.random.default_rng([self.seed, epoch, *shards]).permutation(num_docs)

    def _window_docs(self, epoch: int, w: int) -> np.ndarray:
        """Global ids of window ``w``'s documents in their epoch order."""
        shards = self.windows(epoch)[w]
        start = self.table.shard_start
        docs = np.concatenate(
            [np.zeros(0, dtype=np.int64)] + [np.arange(start[s], start[s] + self.shard_docs[s]) for s in shards]
        )
        return docs[self.doc_order(epoch, shards, len(docs))]

    def _window_cum(self, epoch: int, w: int, extra: int) -> np.ndarray:
        """(docs + 1,) position of each of window ``w``'s documents within the window."""
        lengths = np.asarray(self.table.num_tokens[self.window_docs(epoch, w)], dtype=np.int64) + extra
        return np.concatenate([[0], np.cumsum(lengths)])

    def _window_sizes(self, epoch: int, extra: int) -> np.ndarray:
        """(windows + 1,) position where each window starts in the epoch."""
        per_window = [
            sum(int(self.shard_tokens[s]) + extra * int(self.shard_docs[s]) for s in shards)
            for shards in self.windows(epoch)
        ]
        return np.concatenate([[0], np.cumsum(per_window, dtype=np.int64)])

    def slices(self, epoch: int, start: int, stop: int, extra: int = 0) -> Iterator[tuple[int, int, int]]:
        """(document, first, end) covering positions [start, stop) of the epoch, where a document
        spans ``num_tokens + extra`` positions (``end`` past its tokens: the separator)."""
        bounds = self.window_sizes(epoch, extra)
        w = int(np.searchsorted(bounds, start, side="right")) - 1
        while w < len(bounds) - 1 and bounds[w] < stop:
            cum, docs = self.window_cum(epoch, w, extra), self.window_docs(epoch, w)
            lo, hi = max(start - bounds[w], 0), min(stop - bounds[w], cum[-1])
            i = int(np.searchsorted(cum, lo, side="right")) - 1
            while i < len(docs) and cum[i] < hi:
                first, end = int(max(lo - cum[i], 0)), int(min(hi - cum[i], cum[i + 1] - cum[i]))
                if end > first:  # empty documents span no position
                    yield int(docs[i]), first, end
                i += 1
            w += 1

    def docs(self, epoch: int) -> Iterator[int]:
        """Every usable document of the epoch, in order."""
        for w in range(len(self.windows(epoch))):
            yield from (int(d) for d in self.window_docs(epoch, w))
