"""A deterministic, resumable stream of tokenized documents over epochs.

Order: the shards are permuted by (seed, epoch) and taken ``window`` at a time; the documents of
the shards in a window are pooled and permuted by (seed, epoch, the window's shards) -- a shuffle
buffer of ``window`` shards. Every rank computes the same global stream, so a position in it
(epoch, window position, document position) means the same thing at any world size -- the basis
of exact and elastic resume.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from glm_dist.data.shards import Doc, read_shard

log = logging.getLogger(__name__)


@dataclass
class StreamPosition:
    epoch: int = 0
    window_pos: int = 0  # index of the current window of shards in this epoch's shard permutation
    doc_pos: int = 0  # index into the current window's document permutation


@dataclass
class DocumentStream:
    urls: list[str]
    seed: int
    shuffle: bool = True
    window: int = 1  # shards whose documents are shuffled together
    sizes: list[int] | None = None  # documents per shard (manifest): a shorter shard is corrupt
    reader: Callable[..., list[Doc]] = read_shard
    position: StreamPosition = field(default_factory=StreamPosition)
    skipped: Counter = field(default_factory=Counter)

    def shard_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.urls))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.urls))

    def windows(self, epoch: int) -> list[list[int]]:
        order = [int(i) for i in self.shard_order(epoch)]
        return [order[i:i + self.window] for i in range(0, len(order), self.window)]

    def doc_order(self, epoch: int, shards: list[int], num_docs: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(num_docs)
        return np.random.default_rng([self.seed, epoch, *shards]).permutation(num_docs)

    def __iter__(self) -> Iterator[Doc]:
        """Yield documents forever; ``position`` always names the next document to yield."""
        while True:
            pos = self.position
            whole_epoch = pos.window_pos == 0 and pos.doc_pos == 0
            windows = self.windows(pos.epoch)
            yielded = False
            while pos.window_pos < len(windows):
                shards = windows[pos.window_pos]
                docs = [doc for shard in shards for doc in self._read(shard)]
                perm = self.doc_order(pos.epoch, shards, len(docs))
                while pos.doc_pos < len(perm):
                    doc = docs[perm[pos.doc_pos]]
                    pos.doc_pos += 1
                    yielded = True
                    yield doc
                pos.window_pos, pos.doc_pos = pos.window_pos + 1, 0
            pos.epoch, pos.window_pos, pos.doc_pos = pos.epoch + 1, 0, 0
            if whole_epoch and not yielded:
                raise RuntimeError(f"no readable document in any of {len(self.urls)} shards "
                                   f"(skipped: {dict(self.skipped)})")

    def _read(self, shard: int) -> list[Doc]:
        try:
            return self.reader(self.urls[shard], None if self.sizes is None else self.sizes[shard])
        except OSError as err:
            # Every rank reads the same shard and skips it the same way: counts stay equal.
            self.skipped[f"unreadable_shard:{self.urls[shard]}"] += 1
            log.warning("skipping %s", err)
            return []

    def state_dict(self) -> dict:
        return {"epoch": self.position.epoch, "window_pos": self.position.window_pos, "doc_pos": self.position.doc_pos,
                "seed": self.seed, "num_shards": len(self.urls), "window": self.window}

    def load_state_dict(self, state: dict) -> None:
        saved = (state["seed"], state["num_shards"], state["window"])
        if saved != (self.seed, len(self.urls), self.window):
            raise ValueError(f"data position was saved for seed {saved[0]} over {saved[1]} shards with a shuffle "
                             f"window of {saved[2]}; this run has seed {self.seed} over {len(self.urls)} shards "
                             f"with a window of {self.window} -- resume with the same data, seed and window")
        self.position = StreamPosition(state["epoch"], state["window_pos"], state["doc_pos"])
