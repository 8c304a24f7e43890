"""Vectorised word and n-gram hashing, shared by MinHash dedup and decontamination.

A text is normalised to UTF-8 bytes (one ``bytes.translate``), and every window of n words gets
a polynomial hash mod 2^64 of its bytes, computed from prefix sums over the whole text (no
Python-level loop per word or per n-gram), followed by a 64-bit finaliser to spread the bits.
"""

from __future__ import annotations

import re
import string

import numpy as np

_P = np.uint64(0x100000001B3)  # odd: invertible mod 2^64
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_MIX1, _MIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
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


_ASCII = bytes(range(128))
_PUNCT = bytes(c for c in _ASCII if chr(c) in string.punctuation)
_SPACE = bytes(c for c in _ASCII if chr(c).isspace())
# minhash: punctuation -> space, digits -> 0 (FineWeb's simplification); janitor: punctuation
# deleted (lm-eval-harness). Both: ASCII letters lowercased, any whitespace -> space.
_MINHASH = bytes.maketrans(_PUNCT + _SPACE + b"0123456789", b" " * (len(_PUNCT) + len(_SPACE)) + b"0" * 10)
_JANITOR = bytes.maketrans(_SPACE, b" " * len(_SPACE))
_NON_ASCII_PUNCT = re.compile(r"[^\w\s\x00-\x7f]")


_NON_ASCII_SPACE = re.compile(r"[^\S\x00-\x7f]")


def normalize(text: str, mode: str) -> bytes:
    """Lowercased UTF-8 with punctuation removed (``janitor``) or replaced by spaces and digits
    folded to 0 (``minhash``); words are separated by one or more spaces. ASCII goes through one ``bytes.translate``;
    NBSP (the usual non-ASCII character of web text) is replaced at the byte level; only text
    with other non-ASCII characters takes regex passes for Unicode spaces and punctuation."""
    data = text.lower().encode("utf-8", "surrogatepass")
    if not data.isascii():
        data = data.replace(b"\xc2\xa0", b" ")
        if not data.isascii():
            s = _NON_ASCII_SPACE.sub(" ", data.decode("utf-8", "surrogatepass"))
            data = _NON_ASCII_PUNCT.sub(" " if mode == "minhash" else "", s).encode("utf-8", "surrogatepass")
    return data.translate(_MINHASH) if mode == "minhash" else data.translate(_JANITOR, _PUNCT)


def window_hashes(normalized: bytes, n: int, *, short: bool = True) -> np.ndarray:
    """A uint64 hash of every run of ``n`` consecutive words of a normalised text (runs of spaces
    count as one), computed from byte prefix sums: no Python-level loop per word. With fewer than
    ``n`` words: one hash of the whole text when ``short`` (a short document still gets a MinHash
    signature), else none."""
    b = np.frombuffer(normalized, dtype=np.uint8)
    space = b == 32
    keep = ~space
    keep[1:] |= space[1:] & ~space[:-1]  # the first space of each run
    b = b[keep]
    if len(b) and b[-1] == 32:
        b = b[:-1]
    if len(b) == 0:
        return np.zeros(0, dtype=np.uint64)
    gaps = np.flatnonzero(b == 32)
    starts = np.concatenate(([0], gaps + 1))
    ends = np.concatenate((gaps, [len(b)]))
    if len(starts) < n:
        if not short:
            return np.zeros(0, dtype=np.uint64)
        lo, hi = starts[:1], ends[-1:]
    else:
        lo, hi = starts[: len(starts) - n + 1], ends[n - 1 :]
    _ensure_powers(len(b))
    with np.errstate(over="ignore"):
        prefix = np.zeros(len(b) + 1, dtype=np.uint64)
        np.cumsum((b.astype(np.uint64) + np.uint64(1)) * _powers[: len(b)], dtype=np.uint64, out=prefix[1:])
        h = (prefix[hi] - prefix[lo]) * _inv_powers[lo]
        h ^= (hi - lo).astype(np.uint64) << np.uint64(48)
        h ^= h >> np.uint64(33)
        h *= _MIX1
        h ^= h >> np.uint64(33)
        h *= _MIX2
        h ^= h >> np.uint64(33)
    return h
