"""Bounded byte streams under the readers: a line or record read with a cap, the rest of an over-long
one dropped in pieces, and compressed inputs cut where they inflate beyond the allowed ratio
(docs/architecture.md, decision 11)."""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from typing import Callable

from data_pipeline.recipe import ReaderCfg
from data_pipeline.remote import RemoteReadError, open_url

SKIP_CHUNK = 1 << 20  # the rest of an over-long line is read and dropped in pieces of this size
# Decompressed bytes allowed on top of ratio x compressed: a small file may hold one big repetitive record (an
# 11 MB page of one repeated word gzips 680:1) without being called a bomb; a bomb inflates to gigabytes.
RATIO_ALLOWANCE = 16 << 20


class DecompressionRatioError(OSError):
    """A compressed input inflates beyond ``reader.max_decompression_ratio`` (a decompression bomb)."""


def max_record_bytes(cfg: ReaderCfg) -> int:
    return int(cfg.max_record_mb * 2**20)


def read_line(f, limit: int) -> tuple[bytes | None, int]:
    """The next line of the binary stream ``f`` (b"" at the end) and its length in bytes. A line
    longer than ``limit`` bytes (newline included) comes back as None: at most ``limit + 1`` bytes
    of it are buffered, the rest is read and dropped in ``SKIP_CHUNK`` pieces."""
    line = f.readline(limit + 1)
    if len(line) <= limit:
        return line, len(line)
    n = len(line)
    while not line.endswith(b"\n"):
        line = f.readline(SKIP_CHUNK)
        if not line:
            break
        n += len(line)
    return None, n


def error_reason(err: BaseException, default: str = "truncated or corrupt compressed stream") -> str:
    """The reason an input error is counted under in ``Stats``."""
    if isinstance(err, DecompressionRatioError):
        return "decompression ratio above the limit"
    if isinstance(err, (RemoteReadError, FileNotFoundError)):
        return "input unreadable"
    return default


GZIP_MAGIC = b"\x1f\x8b\x08"  # a gzip member's first bytes: ID1, ID2, deflate


class GzipStream(io.RawIOBase):
    """Multi-member gzip decompression that delivers every byte before a truncation or corruption
    (Python's ``gzip`` raises on a cut stream and loses the data of that read) and goes on after a corrupt
    member at the next member header (WARC files gzip each record on its own: one bad member must not
    take the file's remaining records with it); ``status()`` says how the stream ended and what it
    skipped. One call inflates at most the caller's buffer size."""

    def __init__(self, raw) -> None:
        self.raw = raw
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.tail = b""  # compressed input not yet inflated
        self.member_started = False
        self.truncated = False
        self.errors: list[str] = []  # each corrupt member: what zlib said
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self.done:
            if self.z.eof:  # the next member (WARC files gzip each record on its own)
                self.tail = self.z.unused_data
                self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self.member_started = False
            if not self.tail:
                self.tail = self.raw.read(1 << 16)
            if not self.tail:
                self.done, self.truncated = True, self.member_started
                break
            try:
                out = self.z.decompress(self.tail, len(buf))
            except zlib.error as err:
                self.errors.append(str(err))
                self._next_member()
                continue
            self.tail = self.z.unconsumed_tail
            self.member_started = True
            if out:
                buf[: len(out)] = out
                return len(out)
        return 0

    def _next_member(self) -> None:
        """Skip to the next gzip member header after the corrupt one (past the input that failed); the
        stream ends if there is none."""
        data = self.tail[1:]
        while True:
            at = data.find(GZIP_MAGIC)
            if at >= 0:
                self.tail, self.z, self.member_started = data[at:], zlib.decompressobj(16 + zlib.MAX_WBITS), False
                return
            more = self.raw.read(1 << 16)
            if not more:
                self.tail, self.done = b"", True
                return
            data = data[-(len(GZIP_MAGIC) - 1) :] + more  # a header split across two reads

    def status(self) -> str | None:
        if self.errors:
            return (
                f"corrupt gzip data ({len(self.errors)} member(s), first: {self.errors[0]}); reading resumed at "
                "the next member header after each"
            )
        return "gzip stream ends in the middle of a member (truncated file)" if self.truncated else None


class _Counted(io.RawIOBase):
    """A binary file that counts the bytes read from it (the compressed side of a stream)."""

    def __init__(self, f) -> None:
        self.f = f
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self.f.read(len(buf))
        buf[: len(data)] = data
        self.count += len(data)
        return len(data)


class _RatioGuard(io.RawIOBase):
    """Decompressed bytes, stopped with :class:`DecompressionRatioError` once they exceed ``ratio``
    times the compressed bytes read so far plus ``RATIO_ALLOWANCE``."""

    def __init__(self, inflated, compressed: _Counted, ratio: float) -> None:
        self.inflated, self.compressed, self.ratio = inflated, compressed, ratio
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = self.inflated.readinto(buf)
        self.count += n
        if self.count > self.ratio * self.compressed.count + RATIO_ALLOWANCE:
            raise DecompressionRatioError(
                f"{self.count} bytes inflated from {self.compressed.count} compressed bytes, more than "
                f"reader.max_decompression_ratio={self.ratio:g} times + {RATIO_ALLOWANCE >> 20} MiB (a bomb?); raise "
                f"the limit if the file is genuine"
            )
        return n


def _no_early_end() -> str | None:
    return None


def open_stream(path: str, cfg: ReaderCfg) -> tuple[io.BufferedReader, Callable[[], None], Callable[[], str | None]]:
    """(decompressed binary stream, closer, status) for a possibly compressed file; ``status()``
    returns None or why the stream ended early (truncated / corrupt). Reads raise
    ``DecompressionRatioError`` past the ratio bound and ``RemoteReadError`` when an http(s) input
    fails after the retries."""
    raw = open_url(
        path,
        "rb",
        connect_timeout_s=cfg.http_connect_timeout_s,
        read_timeout_s=cfg.http_read_timeout_s,
        retries=cfg.http_retries,
    )
    compressed = _Counted(raw)
    name = path.lower()
    status = _no_early_end
    if name.endswith(".gz"):
        inflated = GzipStream(compressed)
        status = inflated.status
    elif name.endswith(".zst"):
        import zstandard

        inflated = zstandard.ZstdDecompressor().stream_reader(compressed, read_across_frames=True)
    elif name.endswith(".bz2"):
        inflated = bz2.BZ2File(compressed)
    elif name.endswith(".xz"):
        inflated = lzma.LZMAFile(compressed)
    else:
        return io.BufferedReader(compressed, 1 << 16), raw.close, status
    stream = io.BufferedReader(_RatioGuard(inflated, compressed, cfg.max_decompression_ratio), 1 << 16)

    def close() -> None:
        inflated.close()
        raw.close()

    return stream, close, status
