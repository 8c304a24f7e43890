"""Packing documents into training units, at load time (docs/architecture.md, decision 5).

``SentencePacker`` is RoBERTa's FULL-SENTENCES: whole sentences, contiguous across document
boundaries (a separator token between documents), up to ``capacity`` tokens per unit; a sentence
longer than a unit is cut. Its only state is what is buffered and not yet emitted, so a resumed
run emits exactly the same units.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np


class SentencePacker:
    """Units are (tokens, sentence starts); documents are joined by ``doc_sep`` (None: no separator)."""

    def __init__(self, capacity: int, *, doc_sep: int | None):
        self.capacity, self.doc_sep = capacity, doc_sep
        self.pending: list[np.ndarray] = []  # sentences read but not yet emitted, in order
        self.pending_new_doc: list[bool] = []  # whether each pending sentence starts a document

    def units(self, docs: Iterable, rng_for=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        docs = iter(docs)
        while True:
            while sum(map(len, self.pending)) + len(self.pending) < self.capacity + 1:
                self._push(next(docs))
            yield self._emit()

    def _push(self, doc) -> None:
        tokens = doc.tokens.astype(np.int64)
        bounds = list(doc.sentences) + [len(tokens)]
        for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            for start in range(a, b, self.capacity):  # cut over-long sentences
                self.pending.append(tokens[start : min(b, start + self.capacity)])
                self.pending_new_doc.append(bool(k == 0 and start == a))

    def _emit(self) -> tuple[np.ndarray, np.ndarray]:
        parts, starts, size = [], [], 0
        while self.pending:
            sep = self.doc_sep is not None and self.pending_new_doc[0] and size > 0
            need = len(self.pending[0]) + int(sep)
            if size + need > self.capacity and parts:
                break
            if sep:
                parts.append(np.array([self.doc_sep]))
                size += 1
            starts.append(size)
            parts.append(self.pending.pop(0))
            self.pending_new_doc.pop(0)
            size += len(parts[-1])
        return np.concatenate(parts)[: self.capacity], np.asarray(starts, dtype=np.int64)

    def state_dict(self) -> dict:
        return {
            "pending": [p.tolist() for p in self.pending],
            "pending_new_doc": [bool(b) for b in self.pending_new_doc],
        }

    def load_state_dict(self, state: dict) -> None:
        self.pending = [np.asarray(p, dtype=np.int64) for p in state["pending"]]
        self.pending_new_doc = list(state["pending_new_doc"])
