"""A deterministic, resumable stream of tokenized documents over epochs.

Order: the shards are permuted by (seed, epoch); the documents inside each shard are permuted by
(seed, epoch, shard index). Every rank computes the same global stream, so a position in it
(epoch, shard position, document position) means the same thing at any world size -- the basis of
exact and elastic resume.
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
    shard_pos: int = 0  # index into this epoch's shard permutation
    doc_pos: int = 0  # index into the current shard's document permutation


@dataclass
class DocumentStream:
    urls: list[str]
    seed: int
    shuffle: bool = True
    reader: Callable[[str], list[Doc]] = read_shard
    position: StreamPosition = field(default_factory=StreamPosition)
    skipped: Counter = field(default_factory=Counter)

    def shard_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.urls))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.urls))

    def doc_order(self, epoch: int, shard: int, num_docs: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(num_docs)
        return np.random.default_rng([self.seed, epoch, shard]).permutation(num_docs)

    def __iter__(self) -> Iterator[Doc]:
        """Yield documents forever; ``position`` always names the next document to yield."""
        while True:
            pos = self.position
            whole_epoch = pos.shard_pos == 0 and pos.doc_pos == 0
            order = self.shard_order(pos.epoch)
            yielded = False
            while pos.shard_pos < len(order):
                shard = int(order[pos.shard_pos])
                docs = self._read(shard)
                perm = self.doc_order(pos.epoch, shard, len(docs))
                while pos.doc_pos < len(perm):
                    doc = docs[perm[pos.doc_pos]]
                    pos.doc_pos += 1
                    yielded = True
                    yield doc
                pos.shard_pos, pos.doc_pos = pos.shard_pos + 1, 0
            pos.epoch, pos.shard_pos, pos.doc_pos = pos.epoch + 1, 0, 0
            if whole_epoch and not yielded:
                raise RuntimeError(f"no readable document in any of {len(self.urls)} shards "
                                   f"(skipped: {dict(self.skipped)})")

    def _read(self, shard: int) -> list[Doc]:
        try:
            return self.reader(self.urls[shard])
        except OSError as err:
            # Every rank reads the same shard and skips it the same way: counts stay equal.
            self.skipped[f"unreadable_shard:{self.urls[shard]}"] += 1
            log.warning("skipping %s", err)
            return []

    def state_dict(self) -> dict:
        return {"epoch": self.position.epoch, "shard_pos": self.position.shard_pos,
                "doc_pos": self.position.doc_pos, "seed": self.seed, "num_shards": len(self.urls)}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed or state["num_shards"] != len(self.urls):
            raise ValueError(f"data position was saved for seed {state['seed']} over "
                             f"{state['num_shards']} shards; this run has seed {self.seed} over "
                             f"{len(self.urls)} shards -- resume with the same data and seed")
        self.position = StreamPosition(state["epoch"], state["shard_pos"], state["doc_pos"])
