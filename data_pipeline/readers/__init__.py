"""Input readers: WARC/WET, JSONL (.gz/.zst/.bz2/.xz), Parquet and plain text, from paths, globs or
any fsspec URL. Every reader yields :class:`Document` s and reports a bad record or a damaged file to
``Stats.error`` with the file, the offset (byte offset in the uncompressed stream, or line/row
number) and the reason, then goes on with the next record (or, for a truncated file, stops that
file after everything readable).

Every read is bounded before it is buffered (docs/architecture.md, decision 11): a line or record is
read with a cap (``reader.max_record_mb``) and the rest of an over-long one is dropped in pieces;
a compressed stream that inflates beyond ``reader.max_decompression_ratio`` times the bytes read is
cut there; http(s) inputs have timeouts and bounded retries (``data_pipeline.remote``)."""
from __future__ import annotations

import bz2
import io
import lzma
import zlib
from typing import Callable, Iterator

import fsspec

from data_pipeline.document import Document, Stats
from data_pipeline.pipeline import PipelineError
from data_pipeline.recipe import ReaderCfg
from data_pipeline.remote import RemoteReadError, check_host, check_scheme, open_url, retrying, storage_options

FORMATS = {".warc": "warc", ".wet": "warc", ".arc": "warc", ".jsonl": "jsonl", ".json": "jsonl",
           ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text", ".text": "text", ".md": "text"}
COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")
SKIP_CHUNK = 1 << 20  # the rest of an over-long line is read and dropped in pieces of this size
# Decompressed bytes allowed on top of ratio x compressed: a small file may hold one big repetitive record (an
# 11 MB page of one repeated word gzips 680:1) without being called a bomb; a bomb inflates to gigabytes.
RATIO_ALLOWANCE = 16 << 20


class DecompressionRatioError(OSError):
    """A compressed input inflates beyond ``reader.max_decompression_ratio`` (a decompression bomb)."""


def expand_inputs(patterns: list[str], cfg: ReaderCfg | None = None) -> list[str]:
    """Every file the patterns name, sorted, as full URLs. A pattern that matches nothing stops the
    run at once (a typo must not produce an empty corpus: ``FileNotFoundError``), and so does one
    with a scheme outside the allow-list, an http(s) host that does not resolve, or a listing that
    fails after the retries (``PipelineError``): one line, exit code 2. A plain http(s) URL is not
    fetched here (a list of thousands would cost a request each): if it is missing or does not
    answer, its task counts that as an input error with the URL and the reason."""
    cfg = cfg or ReaderCfg()
    files: list[str] = []
    for pattern in patterns:
        try:
            check_scheme(pattern, "input")
        except ValueError as err:
            raise PipelineError(str(err)) from None
        try:
            files.extend(_expand(pattern, cfg))
        except RemoteReadError as err:
            raise PipelineError(f"input {err}") from None
    return sorted(dict.fromkeys(files))


def _expand(pattern: str, cfg: ReaderCfg) -> list[str]:
    check_host(pattern)
    if pattern.lower().startswith(("http://", "https://")) and not pattern.endswith("/") \
            and not any(ch in pattern for ch in "*?["):
        return [pattern]
    fs, path = fsspec.core.url_to_fs(pattern, **storage_options(
        pattern, connect_timeout_s=cfg.http_connect_timeout_s, read_timeout_s=cfg.http_read_timeout_s))
    matches = retrying(lambda: _matches(fs, path), pattern, retries=cfg.http_retries)
    if not matches:
        raise FileNotFoundError(f"input {pattern!r} matches no file")
    return [fs.unstrip_protocol(m) if fs.protocol not in ("file", ("file", "local")) else m for m in matches]


def _matches(fs, path: str) -> list[str]:
    if fs.isdir(path):
        return [p for p in fs.find(path) if format_of(p, "auto", strict=False)]
    if any(ch in path for ch in "*?["):
        return fs.glob(path)
    return [path] if fs.exists(path) else []


def format_of(path: str, configured: str = "auto", *, strict: bool = True) -> str | None:
    """The reader of ``path`` (``reader.format``, else told by its extension); a name that tells
    none is a ``PipelineError`` (``strict``) or None."""
    if configured != "auto":
        return configured
    name = path.lower()
    for ext in COMPRESSIONS:
        if name.endswith(ext):
            name = name[: -len(ext)]
    for ext, fmt in FORMATS.items():
        if name.endswith(ext):
            return fmt
    if strict:
        names = ", ".join(FORMATS)
        raise PipelineError(f"input {path}: cannot tell its format from its name (accepted: {names}, each optionally "
                            f"compressed as {', '.join(COMPRESSIONS)}); rename it or set reader.format="
                            f"{'|'.join(sorted(set(FORMATS.values())))}")
    return None


def read(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    fmt = format_of(path, cfg.format)
    if fmt == "warc":
        from data_pipeline.readers.warc import read_warc as reader
    elif fmt == "jsonl":
        from data_pipeline.readers.jsonl import read_jsonl as reader
    elif fmt == "parquet":
        from data_pipeline.readers.jsonl import read_parquet as reader
    else:
        from data_pipeline.readers.jsonl import read_text as reader
    limit = cfg.max_docs_per_file
    for i, doc in enumerate(reader(path, cfg, stats)):
        if limit is not None and i >= limit:
            return
        yield doc


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


class GzipStream(io.RawIOBase):
    """Multi-member gzip decompression that delivers every byte before a truncation or corruption
    (Python's ``gzip`` raises on a cut stream and loses the data of that read); ``truncated`` and
    ``error`` say how the stream ended. One call inflates at most the caller's buffer size."""

    def __init__(self, raw) -> None:
        self.raw = raw
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.tail = b""  # compressed input not yet inflated
        self.member_started = False
        self.truncated = False
        self.error: str | None = None
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
                self.done, self.error = True, f"corrupt gzip data: {err}"
                break
            self.tail = self.z.unconsumed_tail
            self.member_started = True
            if out:
                buf[: len(out)] = out
                return len(out)
        return 0

    def status(self) -> str | None:
        return self.error or ("gzip stream ends in the middle of a member (truncated file)" if self.truncated else None)


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
                f"the limit if the file is genuine")
        return n


def _no_early_end() -> str | None:
    return None


def open_stream(path: str, cfg: ReaderCfg) -> tuple[io.BufferedReader, Callable[[], None], Callable[[], str | None]]:
    """(decompressed binary stream, closer, status) for a possibly compressed file; ``status()``
    returns None or why the stream ended early (truncated / corrupt). Reads raise
    ``DecompressionRatioError`` past the ratio bound and ``RemoteReadError`` when an http(s) input
    fails after the retries."""
    raw = open_url(path, "rb", connect_timeout_s=cfg.http_connect_timeout_s,
                   read_timeout_s=cfg.http_read_timeout_s, retries=cfg.http_retries)
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


def load_texts(patterns: list[str], text_field: str = "text", limit: int | None = None) -> list[str]:
    """Texts from any readable input (WARC pages are extracted), e.g. to train the classifier."""
    from data_pipeline.extract.html import extract
    from data_pipeline.recipe import ExtractCfg

    texts: list[str] = []
    cfg, stats = ReaderCfg(text_field=text_field), Stats()
    for path in expand_inputs(patterns):
        for doc in read(path, cfg, stats):
            if doc.payload is not None and extract(doc, ExtractCfg()) is not None:
                continue
            texts.append(doc.text)
            if limit is not None and len(texts) >= limit:
                return texts
    return texts
