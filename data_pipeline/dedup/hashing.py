"""Vectorised word and n-gram hashing, shared by MinHash dedup and decontamination.

A text is normalised with one ``str.translate`` (a table built once for the whole Basic
Multilingual Plane), encoded to UTF-8, and every whitespace-separated word gets a polynomial hash
mod 2^64 computed from prefix sums over the bytes -- no Python-level loop per word -- followed by
a 64-bit finaliser to spread the bits. N-gram hashes combine consecutive word hashes.
"""
from __future__ import annotations

import sys
import unicodedata
from functools import lru_cache

import numpy as np

_P = np.uint64(0x100000001B3)  # odd: invertible mod 2^64
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_MIX1, _MIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_NGRAM_MIX = np.uint64(0x9E3779B97F4A7C15)
_powers = np.ones(1, dtype=np.uint64)
_inv_powers = np.ones(1, dtype=np.uint64)


def _ensure_powers(n: int) -> None:
    global _powers, _inv_powers
    if len(_powers) > n:
        return
    size = max(n + 1, 2 * len(_powers))
    steps, inv_steps = np.full(size, _P, dtype=np.uint64), np.full(size, _P_INV, dtype=np.uint64)
    steps[0] = inv_steps[0] = 1
    with np.errstate(over="ignore"):
        _powers = np.cumprod(steps, dtype=np.uint64)
        _inv_powers = np.cumprod(inv_steps, dtype=np.uint64)


@lru_cache(maxsize=2)
def _table(mode: str) -> dict[int, str | None]:
    """``minhash``: punctuation -> space, digits -> 0 (FineWeb's simplification);
    ``janitor``: punctuation deleted (lm-eval-harness); both: any whitespace -> space."""
    table: dict[int, str | None] = {}
    for cp in range(min(sys.maxunicode, 0xFFFF) + 1):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if ch.isspace():
            table[cp] = " "
        elif cat.startswith("P") or (cat.startswith("S") and mode == "minhash") or ch == "_":
            table[cp] = " " if mode == "minhash" else None
        elif mode == "minhash" and cat == "Nd":
            table[cp] = "0"
    return table


def normalize(text: str, mode: str) -> str:
    return text.lower().translate(_table(mode))


def word_hashes(normalized: str) -> np.ndarray:
    """One uint64 hash per whitespace-separated word of an already normalised text."""
    b = np.frombuffer(normalized.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    if len(b) == 0:
        return np.zeros(0, dtype=np.uint64)
    space = b == 32
    word = ~space
    prev_space = np.empty_like(space)
    prev_space[0], prev_space[1:] = True, space[:-1]
    next_space = np.empty_like(space)
    next_space[-1], next_space[:-1] = True, space[1:]
    starts = np.flatnonzero(word & prev_space)
    ends = np.flatnonzero(word & next_space) + 1
    if len(starts) == 0:
        return np.zeros(0, dtype=np.uint64)
    _ensure_powers(len(b))
    with np.errstate(over="ignore"):
        prefix = np.zeros(len(b) + 1, dtype=np.uint64)
        np.cumsum((b.astype(np.uint64) + np.uint64(1)) * _powers[: len(b)], dtype=np.uint64, out=prefix[1:])
        h = (prefix[ends] - prefix[starts]) * _inv_powers[starts]
        h ^= (ends - starts).astype(np.uint64) << np.uint64(56)
        h ^= h >> np.uint64(33)
        h *= _MIX1
        h ^= h >> np.uint64(33)
        h *= _MIX2
        h ^= h >> np.uint64(33)
    return h


def ngram_hashes(hashes: np.ndarray, n: int, *, short: bool = True) -> np.ndarray:
    """A hash for every run of ``n`` consecutive words. With fewer than ``n`` words: one hash of
    all of them when ``short`` (MinHash: a short document still gets a signature), else none."""
    m = len(hashes)
    if m < n:
        if not short or m == 0:
            return np.zeros(0, dtype=np.uint64)
        n = m
    with np.errstate(over="ignore"):
        out = hashes[: m - n + 1].copy()
        for k in range(1, n):
            out = out * _NGRAM_MIX + hashes[k: m - n + 1 + k]
        out ^= out >> np.uint64(29)
    return out
