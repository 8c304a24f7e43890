"""Reading the token ranges a rank's samples pack, by byte range (docs/architecture.md, decision 12).

A token range [first, end) of a document is ``(end - first) * itemsize`` bytes at ``token_offset +
first * itemsize`` of its shard (data/index.py): the raw data of its ``tokens.npy`` member. The
ranges of one step are grouped by shard, sorted, and neighbours closer than ``gap_bytes`` are
coalesced into one request (at most ``max_request_bytes``); each request is one seek and one read
through fsspec (``open_url``: paths and any allowed URL; plain HTTP with no read-ahead, so a request
fetches exactly its bytes), counted in ``stats``. ``cache_dir`` puts a node-local block cache
(fsspec ``blockcache::``) in front of remote shards. A request that fails is retried ``retries``
times with exponential backoff; then its documents are skipped -- their tokens become ``filler`` so
every sample keeps its shape and every rank its number of batches -- counted and logged. A shard whose
size is not what its index says, or that is gone, is not retried: it is skipped for the rest of the run.

Padding stands in for a bad shard, never for the data: when the reads of ``FAILING_SHARDS``
different shards in a row fail (nothing read between them), the shards are unreachable and
``DataUnreachable`` stops the run. A server that answers a range request with other bytes than
those asked (HTTP 200 and the whole file: it ignores ``Range``) stops it at the first read with
``RangeUnsupported``: no read of it can ever work, so it is neither retried nor padded.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np

from glm_dist.data.index import DocTable
from glm_dist.data.plan import ADDRESS, DOC_SHIFT, TOKEN_MASK
from glm_dist.errors import GlmError

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 64 * 2**20
GATHER_BYTES_PER_RANGE = 64  # ranges shorter than this on average are copied by one gather
OPEN_FILES = 16  # shard files kept open between steps
FAILING_SHARDS = 3  # different shards failing in a row, nothing read between them: the data is unreachable
MAX_BACKOFF_S = 60.0  # the longest wait between two attempts, however many retries
FSSPEC_NO_RANGES = "support range requests"  # fsspec's ValueError when an HTTP server ignores Range


@dataclass
class ReadStats:
    bytes: int = 0  # bytes returned by reads
    requests: int = 0  # seek + read calls that returned data


class _Permanent(OSError):
    """A shard that retrying cannot fix (gone, or not the file its index describes)."""


class RangeUnsupported(GlmError):
    """A server that ignores HTTP range requests: every read of its shards would fail."""


class DataUnreachable(GlmError):
    """Reads of several shards in a row failed after their retries: training on padding would be wrong."""


def intervals(addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc, first, end) of the maximal runs of consecutive token addresses (``ADDRESS`` cleared)."""
    keys = np.unique(addresses)
    if not len(keys):
        return (np.zeros(0, dtype=np.int64),) * 3
    cut = np.flatnonzero(np.diff(keys) != 1) + 1
    first, last = keys[np.concatenate([[0], cut])], keys[np.concatenate([cut - 1, [len(keys) - 1]])]
    return first >> DOC_SHIFT, first & TOKEN_MASK, (last & TOKEN_MASK) + 1


@dataclass
class TokenStore:
    """The tokens read for one step, found by address."""

    keys: np.ndarray  # (I,) doc << 32 | first, sorted
    ends: np.ndarray  # (I,) end token of each interval
    bases: np.ndarray  # (I,) where each interval's tokens start in ``buffer``
    ok: np.ndarray  # (I,) read successfully
    buffer: np.ndarray  # the tokens, in the shards' dtype

    def resolve(self, values: np.ndarray, filler: int) -> np.ndarray:
        """``values`` with each address replaced by its token (``filler`` where it could not be read)."""
        is_address = values >= ADDRESS
        if self.buffer.dtype.names:  # structured records (co-occurrence triples): all addresses
            out = np.zeros(len(values), dtype=self.buffer.dtype)
            found, where = self._find(values[is_address] - ADDRESS)
            out[np.flatnonzero(is_address)[found]] = self.buffer[where[found]]
            return out
        out = values.copy()
        found, where = self._find(values[is_address] - ADDRESS)
        tokens = np.full(int(is_address.sum()), filler, dtype=np.int64)
        tokens[found] = self.buffer[where[found]]
        out[is_address] = tokens
        return out

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whether each address was read, its index in ``buffer``)."""
        if not len(self.keys):
            return np.zeros(len(keys), dtype=bool), np.zeros(len(keys), dtype=np.int64)
        i = np.maximum(np.searchsorted(self.keys, keys, side="right") - 1, 0)
        first = self.keys[i]
        found = (
            (first <= keys)
            & (keys >> DOC_SHIFT == first >> DOC_SHIFT)
            & ((keys & TOKEN_MASK) < self.ends[i])
            & self.ok[i]
        )
        return found, self.bases[i] + (keys - first)


def empty_store(dtype: np.dtype) -> TokenStore:
    z = np.zeros(0, dtype=np.int64)
    return TokenStore(z, z, z, np.zeros(0, dtype=bool), np.zeros(0, dtype=dtype))


def _copy_ranges(data: bytes, offsets: np.ndarray, out: np.ndarray, bases: np.ndarray, sizes: np.ndarray) -> None:
    """Copy the byte ranges ``[offsets, offsets + sizes)`` of ``data`` to ``[bases, bases + sizes)`` of ``out``:
    one gather for many short ranges (its index costs 8 bytes per byte copied), slices for a few long ones."""
    if int(sizes.sum()) > GATHER_BYTES_PER_RANGE * len(sizes):
        for offset, base, size in zip(offsets.tolist(), bases.tolist(), sizes.tolist()):
            out[base : base + size] = np.frombuffer(data, np.uint8, size, offset)
        return
    ends = np.cumsum(sizes)
    within = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - sizes, sizes)  # place in its range
    out[np.repeat(bases, sizes) + within] = np.frombuffer(data, np.uint8)[np.repeat(offsets, sizes) + within]


@dataclass
class RangeReader:
    table: DocTable
    gap_bytes: int = 0
    retries: int = 3
    backoff_s: float = 0.5
    cache_dir: str = ""
    read_timeout_s: float = 60.0
    max_request_bytes: int = MAX_REQUEST_BYTES
    stats: ReadStats = field(default_factory=ReadStats)
    skipped: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    _files: OrderedDict = field(default_factory=OrderedDict)
    _dead: dict[int, str] = field(default_factory=dict)
    _failing: set[int] = field(default_factory=set)  # shards whose reads failed since the last good read

    def __post_init__(self) -> None:
        # config/checks.py range-checks the keys; a reader built any other way must not loop wrongly either
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise GlmError(f"data.read_retries={self.retries!r} must be a whole number, 0 or more")
        for key, value in (("data.read_backoff_s", self.backoff_s), ("read_timeout_s", self.read_timeout_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise GlmError(f"{key}={value!r} must be a number of seconds, 0 or more")

    def read(self, doc: np.ndarray, first: np.ndarray, end: np.ndarray) -> TokenStore:
        """The token intervals (sorted by document, then first token), read in coalesced requests."""
        itemsize, lengths = self.table.dtype.itemsize, end - first
        bases = np.concatenate([[0], np.cumsum(lengths)])
        buffer = np.zeros(int(bases[-1]), dtype=self.table.dtype)
        ok = np.ones(len(doc), dtype=bool)
        start = np.asarray(self.table.token_offset[doc], dtype=np.int64) + first * itemsize
        stop, shard = start + lengths * itemsize, self.table.shard_of(doc)
        order, heads, shards, los, his = self._requests(shard, start, stop)
        tails = np.append(heads[1:], len(order))
        blobs = []
        for r, (s, lo, hi) in enumerate(zip(shards.tolist(), los.tolist(), his.tolist())):
            try:
                blobs.append(self._read(s, lo, hi - lo))
            except OSError as err:
                members = order[heads[r] : tails[r]]
                ok[members] = False
                self._skip(s, doc[members], err)
                blobs.append(bytes(hi - lo))  # its intervals stay zeros, marked unread
                continue
            self._failing.clear()
        at = np.cumsum([0, *map(len, blobs)])[:-1] - los  # each request's bytes in the joined blobs, less its lo
        src = start[order] + np.repeat(at, tails - heads)
        _copy_ranges(b"".join(blobs), src, buffer.view(np.uint8), bases[order] * itemsize, lengths[order] * itemsize)
        return TokenStore(doc << DOC_SHIFT | first, end, bases[:-1], ok, buffer)

    def _requests(self, shard: np.ndarray, start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, ...]:
        """The coalesced requests: (the intervals in request order, where each request's intervals begin in
        it, each request's shard, first byte and end byte). An interval joins the request before it when it
        is in the same shard, starts at most ``gap_bytes`` after the end of every interval before it and keeps
        the request within ``max_request_bytes``. Array operations, not a loop over intervals: a GloVe step
        reads thousands of single-record intervals."""
        order = np.lexsort((start, shard))
        if not len(order):
            return (np.zeros(0, dtype=np.int64),) * 5
        shard, start, stop = shard[order].astype(np.int64), start[order], stop[order]
        apart = shard * (int(stop.max()) + 1)  # shards apart: one shard's ends never reach into the next
        reach = np.maximum.accumulate(stop + apart) - apart  # the end of this interval and every one before it
        joins = (shard[1:] == shard[:-1]) & (start[1:] - reach[:-1] <= self.gap_bytes)
        heads = np.flatnonzero(np.concatenate([[True], ~joins]))
        over = np.maximum.reduceat(stop, heads) - start[heads] > self.max_request_bytes
        if over.any():
            tails = np.append(heads[1:], len(order))
            cuts = [i + self._cuts(start[i:j], stop[i:j]) for i, j in zip(heads[over], tails[over])]
            heads = np.sort(np.concatenate([heads[~over], *cuts]))
        return order, heads, shard[heads], start[heads], np.maximum.reduceat(stop, heads)

    def _cuts(self, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """Where requests of at most ``max_request_bytes`` begin in one run of joined intervals (an interval
        over it is a request alone)."""
        cuts = [0]
        while True:
            reach = np.maximum.accumulate(stop[cuts[-1] :])
            n = max(1, int(np.searchsorted(reach - start[cuts[-1]] > self.max_request_bytes, True)))
            if cuts[-1] + n >= len(start):
                return np.array(cuts)
            cuts.append(cuts[-1] + n)

    def _skip(self, shard: int, docs: np.ndarray, err: OSError) -> None:
        """Count the documents of a failed request; stop once several shards in a row failed."""
        self.skipped[f"unreadable_document:{self.table.url(shard)}"] += len(np.unique(docs))
        self.errors.append(str(err))
        log.warning("skipping %d document(s), their tokens padded: %s", len(np.unique(docs)), err)
        self._failing.add(shard)
        if len(self._failing) >= min(FAILING_SHARDS, int(self.table.usable.sum())):
            raise DataUnreachable(
                f"the reads of {len(self._failing)} different shard(s) of {self.table.root} failed "
                f"in a row after data.read_retries={self.retries} retries each, nothing read "
                f"between them (last: {err}); the shards are unreachable and the batches would "
                f"be padding: check the location and the network, then resume the run"
            )

    def _read(self, shard: int, start: int, size: int) -> bytes:
        if shard in self._dead:
            raise OSError(self._dead[shard])
        for attempt in range(self.retries + 1):
            try:
                f = self._file(shard)
                f.seek(start)
                return self._read_exact(f, size, shard, start)
            except _Permanent as err:
                self._dead[shard] = str(err)
                self._close(shard)
                raise
            except (OSError, ValueError) as err:
                self._close(shard)
                if isinstance(err, ValueError) and FSSPEC_NO_RANGES in str(err):
                    raise RangeUnsupported(self._no_ranges(shard, start, size)) from None
                if attempt == self.retries:
                    raise OSError(
                        f"{self.table.url(shard)}: bytes {start}-{start + size}: {err}; gave up after "
                        f"{attempt + 1} attempt(s)"
                    ) from None
                wait = min(self.backoff_s * 2.0 ** min(attempt, 32), MAX_BACKOFF_S)
                log.warning(
                    "%s: %s; retry %d of %d in %g s", self.table.url(shard), err, attempt + 1, self.retries, wait
                )
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _read_exact(self, f, size: int, shard: int, start: int) -> bytes:
        chunks, got = [], 0
        while got < size:
            chunk = f.read(size - got)
            if not chunk:
                raise OSError(f"short read: {got} of {size} bytes at {start}")
            if len(chunk) > size - got:  # a server that sent more than the range asked for
                raise RangeUnsupported(self._no_ranges(shard, start + got, size - got))
            chunks.append(chunk)
            got += len(chunk)
            self.stats.bytes += len(chunk)
        self.stats.requests += 1
        return b"".join(chunks)

    def _no_ranges(self, shard: int, start: int, size: int) -> str:
        return (
            f"{self.table.url(shard)}: the server ignores HTTP range requests (asked for bytes {start}-"
            f"{start + size - 1}, it answered with other bytes, e.g. HTTP 200 and the whole file); shards are "
            f"read by byte range, so the server must support range requests (HTTP 206, as object stores and "
            f"most web servers do): serve them from one that does, or copy them to a local folder"
        )

    def _file(self, shard: int):
        if shard in self._files:
            self._files.move_to_end(shard)
            return self._files[shard]
        f = self._open(shard)
        self._files[shard] = f
        while len(self._files) > OPEN_FILES:
            _, old = self._files.popitem(last=False)
            old.close()
        return f

    def _open(self, shard: int):
        import io

        from data_pipeline.remote import _http_schemes, open_url

        url, kw = self.table.url(shard), {}
        if self.cache_dir and "://" in url and "::" not in url and not url.startswith("file://"):
            url, kw = f"blockcache::{url}", {"blockcache": {"cache_storage": self.cache_dir}}
        elif _http_schemes(url) and "::" not in url:
            kw = {"cache_type": "none"}  # no read-ahead: a request fetches its bytes, no more
        try:
            f = open_url(url, "rb", retries=0, read_timeout_s=self.read_timeout_s, **kw)
        except FileNotFoundError:
            raise _Permanent(f"{self.table.url(shard)} is missing") from None
        f = f.detach() if isinstance(f, io.BufferedReader) else f  # the raw file: reads fetch what they ask
        size = f.seek(0, 2)
        if size != self.table.shard_bytes[shard]:
            f.close()
            raise _Permanent(
                f"{self.table.url(shard)} is {size} bytes but its index was made for "
                f"{self.table.shard_bytes[shard]}: truncated, corrupt or replaced"
            )
        return f

    def _close(self, shard: int) -> None:
        f = self._files.pop(shard, None)
        if f is not None:
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        for shard in list(self._files):
            self._close(shard)
