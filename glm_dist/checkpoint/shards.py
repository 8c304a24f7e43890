"""The sharded checkpoint format: what a shard is, where its elements sit in the unsplit tensor,
and reading any slice of any parameter from whichever saved shards overlap it.

Every rank writes the slices it owns, with no gather: per parameter of the unsplit model (its
one-process name) and per *kind* (``fp32`` master, each optimizer moment, or ``buffer``), a shard
is the range ``[offset, offset + length)`` of the flattened *tensor-parallel-local* tensor, and
``tp = (dim, parts, rank, size)`` says which slice of the unsplit tensor that local tensor is
(``parallel/tensor.py``: ``parts`` equal side-by-side parts along ``dim``, each cut in ``size``
pieces, piece ``rank`` kept). A flat range of a local tensor covers a sorted list of contiguous
runs of the unsplit tensor's flat index space, so any two shards -- saved at one layout, needed at
another -- overlap in a computable set of runs (``overlaps``), and a rank reads exactly those
bytes. Files, per rank ``r`` of the run that saved::

    shards/rank0000r.json                  index: every shard this rank wrote (JSON)
    shards/rank0000r.<kind>.safetensors    the shards of one kind, one tensor each
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from glm_common.storage import Storage
from glm_dist.checkpoint import tensorfile
from glm_dist.checkpoint.files import MAX_JSON_BYTES, CheckpointError, corrupt, parse_json

TP = tuple  # (dim, parts, rank, size), or None for a tensor that is not split
MERGE_GAP = 1 << 16  # read two pieces of a file at once when at most this many bytes lie between them
KIND = re.compile(r"^[A-Za-z0-9_]{1,64}$")


@dataclass(frozen=True)
class Shard:
    """``length`` elements from ``offset`` of the flattened TP-local tensor of ``name`` / ``kind``;
    ``shape`` is the unsplit tensor's."""

    name: str
    kind: str
    shape: tuple[int, ...]
    tp: TP | None
    offset: int
    length: int

    def to_json(self, key: str) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "shape": list(self.shape),
            "tp": list(self.tp) if self.tp else None,
            "offset": self.offset,
            "length": self.length,
            "key": key,
        }

    @staticmethod
    def from_json(d: dict) -> tuple["Shard", str]:
        """A shard of an index file, checked as untrusted input: strict types, a known kind, a shape
        of at most ``tensorfile.MAX_NUMEL`` elements, and a range inside its tensor."""
        shape, tp = d["shape"], d["tp"]
        if not (
            isinstance(d["name"], str)
            and isinstance(d["kind"], str)
            and isinstance(d["key"], str)
            and tensorfile.counts(shape)
            and len(shape) <= tensorfile.MAX_DIMS
            and (tp is None or (tensorfile.counts(tp) and len(tp) == 4 and tp[1] >= 1 and tp[2] < tp[3]))
            and tensorfile.counts([d["offset"], d["length"]])
        ):
            raise ValueError("a shard's name, kind, key, shape, tp, offset or length has the wrong type")
        if math.prod(shape) > tensorfile.MAX_NUMEL:
            raise ValueError(f"shard of {d['name'][:200]} has shape {shape}, more elements than any model holds")
        shard = Shard(
            d["name"], d["kind"], tuple(shape), tuple(tp) if tp is not None else None, d["offset"], d["length"]
        )
        if not KIND.match(shard.kind) or shard.offset + shard.length > math.prod(local_shape(shard.shape, shard.tp)):
            raise ValueError(f"shard {shard} lies outside its tensor")
        return shard, d["key"]


def split_bounds(n: int, rank: int, size: int) -> tuple[int, int]:
    """Piece ``rank`` of ``n`` cut into ``size`` pieces of ceil(n / size), the last ones shorter
    when ``size`` does not divide ``n`` (the vocabulary split; every other split divides)."""
    share = -(-n // size)
    start = min(n, rank * share)
    return start, min(n, start + share)


def local_shape(shape: tuple[int, ...], tp: TP | None) -> tuple[int, ...]:
    if tp is None:
        return tuple(shape)
    dim, parts, rank, size = tp
    if not (0 <= dim < len(shape)) or (shape[dim] % (parts * size) and parts != 1):
        raise ValueError(f"tensor-parallel slicing {tp} does not divide shape {list(shape)}")
    lo, hi = split_bounds(shape[dim], rank, size)
    return tuple(hi - lo if i == dim else d for i, d in enumerate(shape))


def _runs(shape: tuple[int, ...], tp: TP | None) -> tuple[np.ndarray, int]:
    """Where each contiguous run of the TP-local tensor starts in the unsplit tensor's flat index
    space (in the local tensor's flat order), and the run length."""
    numel = math.prod(shape)
    if tp is None:
        return np.zeros(1, dtype=np.int64), numel
    dim, parts, rank, size = tp
    outer, n, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1 :])
    width = n // parts
    lo, hi = split_bounds(width, rank, size)
    o = np.arange(outer, dtype=np.int64)[:, None]
    p = np.arange(parts, dtype=np.int64)[None, :]
    return ((o * n + p * width + lo) * inner).reshape(-1), (hi - lo) * inner


def runs(shard: Shard) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unsplit flat intervals ``[starts, ends)`` the shard covers (sorted, disjoint) and the
    position of each in the shard."""
    if shard.length == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    starts, run = _runs(shard.shape, shard.tp)
    first, last = shard.offset // run, (shard.offset + shard.length - 1) // run
    k = np.arange(first, last + 1, dtype=np.int64)
    lo = np.maximum(k * run, shard.offset)
    hi = np.minimum((k + 1) * run, shard.offset + shard.length)
    return starts[k] + (lo - k * run), starts[k] + (hi - k * run), lo - shard.offset


def overlaps(need: Shard, have: Shard) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elements of ``need`` found in ``have``: (position in need, position in have, count) per
    contiguous piece, adjacent pieces merged."""
    s, e, pos_a = runs(need)
    t, u, pos_b = runs(have)
    lo = np.searchsorted(u, s, side="right")  # first run of ``have`` ending after each start
    hi = np.searchsorted(t, e, side="left")  # first run of ``have`` starting at or after each end
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    if total == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    ia = np.repeat(np.arange(len(s)), counts)
    jb = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(lo, counts)
    start, end = np.maximum(s[ia], t[jb]), np.minimum(e[ia], u[jb])
    dst, src, n = pos_a[ia] + (start - s[ia]), pos_b[jb] + (start - t[jb]), end - start
    keep = n > 0
    return _merge(dst[keep], src[keep], n[keep])


def _merge(dst: np.ndarray, src: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Join pieces that continue each other in both tensors."""
    if len(n) <= 1:
        return dst, src, n
    joins = (dst[1:] == dst[:-1] + n[:-1]) & (src[1:] == src[:-1] + n[:-1])
    heads = np.concatenate([[True], ~joins])
    group = np.cumsum(heads) - 1
    return dst[heads], src[heads], np.bincount(group, weights=n).astype(np.int64)


# -- the shards a checkpoint holds --------------------------------------------------------------------
def index_file(rank: int) -> str:
    return f"shards/rank{rank:05d}.json"


def data_file(rank: int, kind: str) -> str:
    return f"shards/rank{rank:05d}.{kind}.safetensors"


class ShardIndex:
    """Every shard of a checkpoint, from every saving rank's index (JSON, bounded). The elements an
    index claims are bounded by the bytes of its data files (verified sizes in meta.json), so nothing
    is allocated for a tensor that is not there."""

    def __init__(self, ckpt: Storage, meta: dict):
        self.ckpt = ckpt
        self.by_key: dict[tuple[str, str], list[tuple[Shard, str, str]]] = defaultdict(list)
        self.shapes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._kinds: dict[str, set[str]] = defaultdict(set)
        self._headers: dict[str, dict[str, tensorfile.Entry]] = {}
        self._files = meta["files"]
        for rel in sorted(r for r in meta["files"] if re.fullmatch(r"shards/rank\d{5}\.json", r)):
            self._add(rel)

    def _add(self, rel: str) -> None:
        index = parse_json(self.ckpt.read(rel, max_bytes=MAX_JSON_BYTES, purpose="meta"), f"{self.ckpt}/{rel}")
        claimed: dict[str, int] = defaultdict(int)  # data file -> bytes its shards take at least
        try:
            rank = int(index["rank"])
            for d in index["shards"]:
                shard, key = Shard.from_json(d)
                data = data_file(rank, shard.kind)
                claimed[data] += shard.length * min_itemsize(shard.kind)
                self.by_key[(shard.name, shard.kind)].append((shard, data, key))
                self.shapes.setdefault((shard.name, shard.kind), shard.shape)
                self._kinds[shard.name].add(shard.kind)
        except (KeyError, TypeError, ValueError) as err:
            raise corrupt(f"{self.ckpt}/{rel}", err) from None
        for data, nbytes in claimed.items():
            size = self._files.get(data, {}).get("size", 0)
            if nbytes > size:
                raise corrupt(f"{self.ckpt}/{data}", f"{size} bytes, fewer than the {nbytes} its index {rel} needs")

    def names(self, kind: str) -> list[str]:
        return sorted(name for name, kinds in self._kinds.items() if kind in kinds)

    def shape(self, name: str, kind: str) -> tuple[int, ...] | None:
        return self.shapes.get((name, kind))

    def kinds(self, name: str) -> list[str]:
        return sorted(self._kinds.get(name, ()))

    def entry(self, rel: str, key: str) -> tensorfile.Entry:
        if rel not in self._headers:
            self._headers[rel] = tensorfile.read_header(self.ckpt, rel)
        try:
            return self._headers[rel][key]
        except KeyError:
            raise corrupt(f"{self.ckpt}/{rel}", f"no tensor {key!r}") from None

    def read(self, need: Shard, out: torch.Tensor) -> None:
        """Fill ``out`` (a contiguous CPU tensor of ``need.length`` elements) from every saved shard
        that overlaps ``need``; every element must be found, each saved tensor of the dtype and shape
        its index and kind say."""
        found = 0
        for have, rel, key in self.by_key.get((need.name, need.kind), []):
            if have.shape != need.shape:
                raise CheckpointError(
                    f"checkpoint {self.ckpt}: {need.name} has shape {list(have.shape)}, the model "
                    f"{list(need.shape)}; resume with the model config it was saved with"
                )
            dst, src, n = overlaps(need, have)
            if len(n):
                entry = self.entry(rel, key)
                self._check(rel, key, entry, have, out.dtype)
                found += int(n.sum())
                self._copy(rel, entry, dst, src, n, out)
        if found != need.length:
            raise CheckpointError(
                f"checkpoint {self.ckpt} holds {found} of the {need.length} elements of "
                f"{need.name} ({need.kind}) this rank needs; it does not match the model or its "
                f"optimizer -- resume with the config it was saved with"
            )

    def _check(self, rel: str, key: str, entry: tensorfile.Entry, have: Shard, dtype: torch.dtype) -> None:
        """The saved tensor is what the index says: fp32 for every kind but buffers (which must have
        the dtype asked for, or both be floating point), ``have.length`` elements, flat or whole."""
        saved = tensorfile.NAMES[entry.dtype]
        if have.kind != "buffer" and entry.dtype != torch.float32:
            raise corrupt(f"{self.ckpt}/{rel}", f"tensor {key} is {saved}, its index says {have.kind} (F32)")
        if (
            have.kind == "buffer"
            and entry.dtype != dtype
            and not (entry.dtype.is_floating_point and dtype.is_floating_point)
        ):
            raise corrupt(f"{self.ckpt}/{rel}", f"buffer {key} is {saved}, the model's is {dtype}")
        whole = have.tp is None and have.offset == 0 and have.length == math.prod(have.shape)
        if entry.shape != (have.length,) and not (whole and entry.shape == have.shape):
            raise corrupt(
                f"{self.ckpt}/{rel}",
                f"tensor {key} has shape {list(entry.shape)}, its index says "
                f"{have.length} elements of {list(have.shape)}",
            )

    def _copy(
        self, rel: str, entry: tensorfile.Entry, dst: np.ndarray, src: np.ndarray, n: np.ndarray, out: torch.Tensor
    ) -> None:
        """Read pieces of one saved tensor into ``out``: straight into ``out``'s memory when one
        piece is a whole read of the same dtype, else a span at a time, pieces nearer than
        ``MERGE_GAP`` read together."""
        size = entry.dtype.itemsize
        order = np.argsort(src)
        dst, src, n = dst[order], src[order], n[order]
        gaps = (src[1:] - (src[:-1] + n[:-1])) * size
        cuts = np.concatenate([[0], np.nonzero(gaps > MERGE_GAP)[0] + 1, [len(n)]])
        flat = out.view(-1)
        for a, b in zip(cuts[:-1], cuts[1:]):
            lo, hi = int(src[a]), int(src[b - 1] + n[b - 1])
            if b - a == 1 and entry.dtype == out.dtype:
                target = flat[int(dst[a]) : int(dst[a]) + int(n[a])]
                self._read_exact(rel, entry.at(lo), target)
                continue
            span = torch.empty(hi - lo, dtype=entry.dtype)
            self._read_exact(rel, entry.at(lo), span)
            for d, s, k in zip(dst[a:b].tolist(), src[a:b].tolist(), n[a:b].tolist()):
                flat[d : d + k].copy_(span[s - lo : s - lo + k])

    def _read_exact(self, rel: str, offset: int, target: torch.Tensor) -> None:
        view = memoryview(target.view(torch.uint8).numpy()) if target.numel() else memoryview(bytearray())
        if self.ckpt.read_into(rel, offset, view, purpose="data") != len(view):
            raise CheckpointError(f"checkpoint file {self.ckpt}/{rel} is truncated; use an earlier checkpoint")

    def whole(self, name: str, kind: str = "fp32", dtype: torch.dtype | None = None) -> torch.Tensor:
        """The unsplit tensor ``name`` assembled from its shards (one parameter in memory), in
        ``dtype`` (default: as saved). Allocated only once its shards cover it."""
        shape, saved = self.shapes[(name, kind)], self.by_key[(name, kind)]
        if sum(have.length for have, _, _ in saved) < math.prod(shape):
            raise CheckpointError(
                f"checkpoint {self.ckpt} holds {sum(have.length for have, _, _ in saved)} of the "
                f"{math.prod(shape)} elements of {name} ({kind}); use an earlier checkpoint"
            )
        out = torch.empty(shape, dtype=dtype or self.entry(*saved[0][1:]).dtype)
        self.read(Shard(name, kind, shape, None, 0, math.prod(shape)), out)
        return out


def min_itemsize(kind: str) -> int:
    """Bytes per element at least: every kind is fp32 but buffers (any dtype)."""
    return 1 if kind == "buffer" else 4
