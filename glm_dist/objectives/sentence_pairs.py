"""Segment pairs for BERT's next-sentence prediction and ALBERT's sentence-order prediction
(google-research/bert and albert create_pretraining_data.py).

From each document, sentences are accumulated into a chunk up to a target length (the maximum,
or with probability 0.1 a random shorter one); the chunk is split at a random sentence into A and
B. NSP: with p = 0.5, B is replaced by text from another document (label 1 = random). SOP: A and B
are always consecutive; with p = 0.5 they are swapped (label 1 = swapped). The pair is trimmed to
fit, from a random end, and framed as ``[CLS] A [SEP] B [SEP]`` with segment ids 0/1.

The "other document" is the previous one in the (shuffled) stream; the builder keeps it, and the
document it is working through, as its state -- so a resumed run builds the same pairs.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np

SHORT_SEQ_PROB = 0.1


class PairBuilder:
    def __init__(self, seq_len: int, *, cls_id: int, sep_id: int, mode: str = "nsp"):
        if mode not in ("nsp", "sop"):
            raise ValueError(f"mode must be 'nsp' or 'sop', not {mode!r}")
        self.max_tokens, self.cls_id, self.sep_id, self.mode = seq_len - 3, cls_id, sep_id, mode
        self.current: list[np.ndarray] = []  # sentences of the document being consumed, not yet used
        self.whole: list[np.ndarray] = []  # all sentences of that document
        self.previous: list[np.ndarray] = []  # all sentences of the document before it
        self.count = 0  # pairs built (the sample id of the next pair)

    def pairs(self, docs: Iterable, rng_for: Callable[[int], np.random.Generator]) -> Iterator[dict]:
        docs = iter(docs)
        while True:
            while len(self.current) < 2 and not (self.current and self.mode == "nsp"):
                self._next_doc(next(docs))
            rng = rng_for(self.count)
            self.count += 1
            yield self._pair(rng)

    def _next_doc(self, doc) -> None:
        if self.whole:
            self.previous = self.whole
        bounds = list(doc.sentences) + [len(doc.tokens)]
        self.whole = [doc.tokens[a:b].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        self.current = list(self.whole)

    def _pair(self, rng: np.random.Generator) -> dict:
        target = self.max_tokens if rng.random() >= SHORT_SEQ_PROB else int(rng.integers(2, self.max_tokens + 1))
        chunk, size = [], 0
        while self.current and (size < target or len(chunk) < 2):
            chunk.append(self.current.pop(0))
            size += len(chunk[-1])
            if size >= target and len(chunk) >= 2:
                break
        a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
        a, b = np.concatenate(chunk[:a_end]), chunk[a_end:]
        label = 0
        if self.mode == "nsp" and (not b or rng.random() < 0.5) and self.previous:
            label = 1
            self.current = chunk[a_end:] + self.current  # put the unused sentences back
            other = np.concatenate(self.previous)
            start = int(rng.integers(0, max(1, len(other) - 1)))
            b = [other[start:start + max(1, target - len(a))]]
        b = np.concatenate(b) if b else np.zeros(0, dtype=np.int64)
        if self.mode == "sop" and rng.random() < 0.5:
            a, b, label = b, a, 1
        a, b = _truncate_pair(a, b, self.max_tokens, rng)
        tokens = np.concatenate([[self.cls_id], a, [self.sep_id], b, [self.sep_id]])
        segments = np.concatenate([np.zeros(len(a) + 2, dtype=np.int64), np.ones(len(b) + 1, dtype=np.int64)])
        return {"tokens": tokens, "token_type_ids": segments, "sentence_label": label}

    def state_dict(self) -> dict:
        return {"current": [s.tolist() for s in self.current], "whole": [s.tolist() for s in self.whole],
                "previous": [s.tolist() for s in self.previous], "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.current = [np.asarray(s, dtype=np.int64) for s in state["current"]]
        self.whole = [np.asarray(s, dtype=np.int64) for s in state["whole"]]
        self.previous = [np.asarray(s, dtype=np.int64) for s in state["previous"]]
        self.count = state["count"]


def _truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Trim the longer segment, one token at a time from a random end, until both fit."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        trimmed = longer[1:] if rng.random() < 0.5 else longer[:-1]
        a, b = (trimmed, b) if longer is a else (a, trimmed)
    return a, b
