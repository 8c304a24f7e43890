"""File-based shuffles between the corpus-wide steps (buckets, clusters, removals, decontam).

A producing task writes its records into one object, sorted by destination (a hash-range partition,
or an input file), and then ``KEY.idx``: the record offsets of every destination (int64, one more
than there are destinations). A consuming task reads its own slice of every producer -- two range
reads each -- so it holds one partition of the data, never the whole.

Documents are named by a packed id, ``input file << 32 | position in the file``: ordering these ids
is input order (the first document of a duplicate cluster stays), and the input file of a document
is its id's top half. No global numbering (and no pass over all files to count them) is needed.
"""

from __future__ import annotations

import numpy as np

from glm_common.storage import Storage

EDGE = np.dtype([("u", "<i8"), ("v", "<i8")])  # an edge, or any pair of document ids
_FILE_SHIFT = np.int64(32)
_MIX1, _MIX2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
RANGES_PER_BATCH = 512  # remote slices fetched together (bounds the bytes in flight)


def packed_ids(file: int, n: int) -> np.ndarray:
    return (np.int64(file) << _FILE_SHIFT) | np.arange(n, dtype=np.int64)


def file_of(ids: np.ndarray) -> np.ndarray:
    return (ids >> _FILE_SHIFT).astype(np.int64)


def position_of(ids: np.ndarray) -> np.ndarray:
    return (ids & np.int64(0xFFFFFFFF)).astype(np.int64)


def key_partition(keys: np.ndarray, parts: int) -> np.ndarray:
    """The hash range of each uniform 64-bit key: partition p holds [p, p + 1) * 2^64 / parts.
    Monotone in the key, so partitions concatenated in order stay sorted."""
    return (((keys.astype(np.uint64) >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32)).astype(np.int64)


def node_partition(ids: np.ndarray, parts: int) -> np.ndarray:
    """The partition of each document id: its hash range after a 64-bit mix (ids are sequential)."""
    h = ids.astype(np.uint64)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= _MIX1
        h ^= h >> np.uint64(33)
        h *= _MIX2
        h ^= h >> np.uint64(33)
    return key_partition(h, parts)


def as_edges(records: np.ndarray) -> np.ndarray:
    """An ``EDGE`` array as an (n, 2) int64 view."""
    return records.view("<i8").reshape(-1, 2) if len(records) else np.zeros((0, 2), np.int64)


def write_routed(store: Storage, key: str, records: np.ndarray, dest: np.ndarray, destinations: int) -> list[int]:
    """Write ``records`` (structured, or rows of a 2-D array) grouped by ``dest``; returns the count
    of each destination."""
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=destinations) if len(dest) else np.zeros(destinations, np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype("<i8")
    with store.open_write(key) as f:
        for lo in range(0, len(order), 1 << 20):  # copies stay small
            f.write(np.ascontiguousarray(records[order[lo : lo + (1 << 20)]]).tobytes())
    store.write_bytes(key + ".idx", offsets.tobytes())
    return counts.tolist()


def read_routed(store: Storage, keys: list[str], part: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Destination ``part``'s records from every producer in ``keys``, concatenated in that order,
    and how many came from each producer."""
    size = dtype.itemsize
    bounds = []
    for lo in range(0, len(keys), RANGES_PER_BATCH):
        batch = keys[lo : lo + RANGES_PER_BATCH]
        got = store.read_ranges([k + ".idx" for k in batch], [8 * part] * len(batch), [8 * part + 16] * len(batch))
        bounds += [np.frombuffer(b, "<i8") for b in got]
    for key, b in zip(keys, bounds):
        if len(b) != 2:
            raise ValueError(f"{store.path(key)}.idx has no destination {part}: written for fewer partitions")
    total = int(sum(b[1] - b[0] for b in bounds))
    out = np.empty(total, dtype)
    view, at = out.view(np.uint8), 0
    for lo in range(0, len(keys), RANGES_PER_BATCH):
        batch, spans = keys[lo : lo + RANGES_PER_BATCH], bounds[lo : lo + RANGES_PER_BATCH]
        for data in store.read_ranges(batch, [int(b[0]) * size for b in spans], [int(b[1]) * size for b in spans]):
            view[at : at + len(data)] = np.frombuffer(data, np.uint8)
            at += len(data)
    if at != total * size:
        raise ValueError(f"short read of partition {part}: {at} of {total * size} bytes (a truncated work file?)")
    return out, np.array([b[1] - b[0] for b in bounds], dtype=np.int64)
