"""Exact and MinHash-LSH near-duplicate keys: the map side of dedup.

For every document that survived the filters (one filter task per input file): an exact key
(128-bit hash of the text lowercased with whitespace folded) and ``bands`` LSH band keys. The
stages after it (``stages/buckets.py``, ``stages/clusters.py``, ``stages/removals.py``) group equal
keys by hash range, find the connected components of the pairs partition by partition, and keep
the document of each component that comes first in (input file, position) order -- deterministic,
whatever the executor.

Signatures follow FineWeb: word 5-grams of simplified text (lowercase, digits -> 0, punctuation
removed), 14 bands x 8 rows = 112 permutations (similarity threshold ~0.72). Shingle hashes come
from byte prefix sums over the normalised text (``hashing.window_hashes``) and the 112 permutations
run as one blocked matrix operation per document (see :class:`MinHasher`).
"""

from __future__ import annotations

import numpy as np
import xxhash

from data_pipeline.dedup.hashing import normalize, window_hashes

_SHIFT = np.uint64(32)


def exact_key(text: str) -> tuple[int, int]:
    """128-bit hash of the text lowercased with whitespace folded, as two uint64."""
    h = xxhash.xxh3_128_intdigest(" ".join(text.lower().split()).encode("utf-8", "surrogatepass"))
    return h >> 64, h & 0xFFFFFFFFFFFFFFFF


class MinHasher:
    """MinHash signatures with ``bands * rows`` permutations ``h_a(x) = a*x mod 2^32`` (odd ``a``)
    over 32-bit shingle hashes: multiplication by an odd number is a bijection of the 32-bit words,
    the shingle hashes are already well mixed, and uint32 products are SIMD-friendly (about twice
    the speed of uint64). The Jaccard estimate is unbiased within test tolerance (tests/test_pipeline.py)."""

    def __init__(self, bands: int = 14, rows: int = 8, ngram: int = 5, seed: int = 1) -> None:
        self.bands, self.rows, self.ngram = bands, rows, ngram
        rng = np.random.default_rng(seed)
        self.a = (rng.integers(0, 2**31, size=bands * rows, dtype=np.uint32) * np.uint32(2) + np.uint32(1)).astype(
            np.uint32
        )

    def signature(self, text: str) -> np.ndarray:
        # A repeated shingle does not change a minimum: no need to deduplicate them first.
        shingles = (window_hashes(normalize(text, "minhash"), self.ngram) >> _SHIFT).astype(np.uint32)
        out = np.full(len(self.a), np.iinfo(np.uint32).max, dtype=np.uint32)
        for i in range(0, len(shingles), 2048):  # (perms x 2048) blocks stay in cache
            np.minimum(out, np.multiply.outer(self.a, shingles[i : i + 2048]).min(axis=1), out=out)
        return out

    def band_keys(self, signature: np.ndarray) -> np.ndarray:
        rows = signature.reshape(self.bands, self.rows).astype("<u4")
        return np.array([xxhash.xxh64_intdigest(r.tobytes()) for r in rows], dtype=np.uint64)
