"""Exact and MinHash-LSH near-duplicate detection, as a file-based map/reduce.

map (one task per input file): for every document that survived the filters, an exact key
(128-bit hash of the text lowercased with whitespace folded) and ``bands`` LSH band keys.
buckets (one task per band, plus one for the exact keys): documents that share a key -> edges.
clusters (one task): connected components of all edges; each component keeps the document that
comes first in (input file, position) order -- deterministic, whatever the executor -- and the rest
go on a per-task removal list that the write stage applies.

Signatures follow FineWeb: word 5-grams of simplified text (lowercase, digits -> 0, punctuation
removed), 14 bands x 8 rows = 112 permutations (similarity threshold ~0.72). Shingle hashes come from byte prefix sums over the normalised text
(``hashing.window_hashes``) and the 112 permutations run as one blocked matrix operation per
document (see :class:`MinHasher`).
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
        self.a = (rng.integers(0, 2**31, size=bands * rows, dtype=np.uint32) * np.uint32(2) + np.uint32(1)).astype(np.uint32)

    def signature(self, text: str) -> np.ndarray:
        # A repeated shingle does not change a minimum: no need to deduplicate them first.
        shingles = (window_hashes(normalize(text, "minhash"), self.ngram) >> _SHIFT).astype(np.uint32)
        out = np.full(len(self.a), np.iinfo(np.uint32).max, dtype=np.uint32)
        for i in range(0, len(shingles), 2048):  # (perms x 2048) blocks stay in cache
            np.minimum(out, np.multiply.outer(self.a, shingles[i:i + 2048]).min(axis=1), out=out)
        return out

    def band_keys(self, signature: np.ndarray) -> np.ndarray:
        rows = signature.reshape(self.bands, self.rows).astype("<u4")
        return np.array([xxhash.xxh64_intdigest(r.tobytes()) for r in rows], dtype=np.uint64)


def edges_from_keys(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Pairs (first id, other id) for every group of equal keys. ``keys`` may be 2-D (compared
    row-wise). Returns an (E, 2) int64 array."""
    if len(ids) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.lexsort(keys.T[::-1]) if keys.ndim == 2 else np.argsort(keys, kind="stable")
    k, i = keys[order], ids[order]
    same = np.all(k[1:] == k[:-1], axis=1) if keys.ndim == 2 else k[1:] == k[:-1]
    if not same.any():
        return np.zeros((0, 2), dtype=np.int64)
    # Link each member to its predecessor in the sorted run: a chain connects the whole group.
    return np.stack([i[:-1][same], i[1:][same]], axis=1).astype(np.int64)


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Component label (the smallest member id) of each of ``n`` nodes."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if len(edges) == 0:
        return np.arange(n)
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (edges[:, 0], edges[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    smallest = np.full(labels.max() + 1, n, dtype=np.int64)
    np.minimum.at(smallest, labels, np.arange(n))
    return smallest[labels]
