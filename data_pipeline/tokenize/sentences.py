"""Sentence boundaries, stored with each tokenized document (NSP/SOP pairs, FULL-SENTENCES packing,
BART's sentence permutation)."""

from __future__ import annotations

import re

import numpy as np

# A sentence ends at . ! ? (and closing quotes/brackets) followed by whitespace, or at a blank line.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n\s*\n")


def sentence_char_starts(text: str) -> list[int]:
    """Character offsets where sentences start (0 first)."""
    starts = [0]
    for m in _BOUNDARY.finditer(text):
        if m.end() < len(text):
            starts.append(m.end())
    return starts


def sentence_token_starts(char_starts: list[int], offsets: list[tuple[int, int]]) -> np.ndarray:
    """Token index of each sentence start: the first token that begins at or after it (int32, unique)."""
    if not offsets:
        return np.zeros(0, dtype=np.int32)
    token_starts = np.fromiter((o[0] for o in offsets), dtype=np.int64, count=len(offsets))
    idx = np.searchsorted(token_starts, np.asarray(char_starts), side="left")
    idx = np.unique(idx[idx < len(offsets)])
    if idx.size == 0 or idx[0] != 0:
        idx = np.concatenate([[0], idx])
    return idx.astype(np.int32)
