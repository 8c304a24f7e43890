"""A WARC / WET reader that accounts for every record.

The format is simple (a version line, ``Name: value`` headers, a blank line, ``Content-Length``
bytes, a blank line), so this reader parses it itself over a decompressed stream (zlib in C via
``gzip``; per-record gzip members are read as one stream). That keeps exact byte offsets for
every problem: a record that does not start with ``WARC/``, a missing or bad Content-Length, a
record cut short, a gzip stream that ends early or is corrupt -- each is reported to ``Stats`` with
the file and offset, the reader re-synchronises on the next ``WARC/`` line, and the pages before
the damage are kept. Response records keep URL, date, HTTP content type and charset; WET
``conversion`` records are text already; ``request``/``metadata``/``warcinfo`` records are counted
by type but are not documents.
"""
from __future__ import annotations

import os
import zlib
from typing import Iterator

from data_pipeline.document import Document, Stats
from data_pipeline.readers import SKIP_CHUNK, error_reason, max_record_bytes, open_stream, read_line
from data_pipeline.recipe import ReaderCfg

READ_ERRORS = (EOFError, OSError, zlib.error)
PAGE_TYPES = {b"response", b"resource", b"conversion"}
MAX_HEADER_BYTES = 1 << 20  # a WARC header block (version line + headers); real ones hold a few KiB


class _HeadersTooLong(Exception):
    """A WARC header block over ``MAX_HEADER_BYTES`` (an endless header line, or endless headers)."""


class _CutShort(Exception):
    """The stream ends inside a record's content block."""


class _Counting:
    """Bounded readline / read over the decompressed stream, tracking the uncompressed offset."""

    def __init__(self, f) -> None:
        self.f = f
        self.offset = 0

    def readline(self, limit: int) -> bytes | None:
        """The next line (b"" at the end), or None for a line over ``limit`` bytes (skipped)."""
        line, n = read_line(self.f, limit)
        self.offset += n
        return line

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        self.offset += len(data)
        return data

    def skip(self, n: int) -> int:
        done = 0
        while done < n:
            chunk = self.read(min(SKIP_CHUNK, n - done))
            if not chunk:
                break
            done += len(chunk)
        return done


def read_warc(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    try:
        stream, close, status = open_stream(path, cfg)
    except READ_ERRORS as err:
        stats.error(error_reason(err), path, 0, f"{type(err).__name__}: {err}")
        return
    f, early = _Counting(stream), False
    try:
        for doc in _pages(f, path, cfg, stats):
            try:
                yield doc
            except GeneratorExit:  # the consumer stopped early (max_docs_per_file)
                early = True
                raise
    except READ_ERRORS as err:
        stats.error(error_reason(err), path, f.offset, f"{type(err).__name__}: {err}")
    finally:
        ended = None if early else status()
        if ended:
            stats.error("truncated or corrupt compressed stream", path, f.offset, ended)
        close()


def _pages(f: _Counting, path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    name = os.path.basename(path)
    index, quiet = 0, False
    while True:
        start = f.offset
        try:
            headers = _read_headers(f, path, stats, quiet=quiet)
        except _HeadersTooLong as err:
            stats.error("malformed WARC record", path, start, str(err))
            quiet = True  # the next call resynchronises on the next WARC/ line
            continue
        if headers is None:
            return
        length = _content_length(headers)
        quiet = length is None
        if length is None:
            stats.error("malformed WARC record", path, start, "missing or invalid Content-Length")
            continue  # _read_headers resynchronises on the next WARC/ line
        try:
            block = _page_block(f, headers, length, cfg, stats)
        except _CutShort as err:
            stats.error("truncated WARC record", path, start, str(err))
            return
        if block is None:
            continue
        doc = _document(headers, headers.get(b"warc-type", b"").lower(), block, f"{name}#{index}", path, start, stats)
        index += 1
        if doc is not None:
            yield doc


def _page_block(f: _Counting, headers: dict[bytes, bytes], length: int, cfg: ReaderCfg, stats: Stats) -> bytes | None:
    """The content block of a page record; None for another record type or an oversized page
    (skipped and counted)."""
    rtype = headers.get(b"warc-type", b"").lower()
    if rtype not in PAGE_TYPES:
        stats.records[rtype.decode("latin-1") or "unknown"] += 1
        if f.skip(length) < length:
            raise _CutShort(f"{rtype.decode('latin-1')} record cut short")
        return None
    if length > max_record_bytes(cfg):
        read_stage = stats.stage("read")
        read_stage.seen += 1
        read_stage.bytes_in += length
        read_stage.dropped[f"record larger than {cfg.max_record_mb:g} MB"] += 1
        if f.skip(length) < length:
            raise _CutShort("cut short")
        return None
    block = f.read(length)
    if len(block) < length:
        raise _CutShort(f"Content-Length {length} but only {len(block)} bytes before the end")
    return block


def _read_headers(f: _Counting, path: str, stats: Stats, quiet: bool = False) -> dict[bytes, bytes] | None:
    """Skip to the next ``WARC/`` version line (reporting anything else once) and parse the headers.
    None at the end of the stream; ``_HeadersTooLong`` past ``MAX_HEADER_BYTES``."""
    junk_at = None
    while True:
        at = f.offset
        line = f.readline(MAX_HEADER_BYTES)
        if line == b"":
            if junk_at is not None:
                stats.error("malformed WARC record", path, junk_at, "data that is not a WARC record")
            return None
        if line is not None and line.startswith(b"WARC/"):
            break
        if (line is None or line.strip()) and junk_at is None and not quiet:
            junk_at = at
    if junk_at is not None:
        stats.error("malformed WARC record", path, junk_at, "data that is not a WARC record (skipped to the next one)")
    headers: dict[bytes, bytes] = {}
    budget = MAX_HEADER_BYTES - len(line)
    while True:
        line = f.readline(budget)
        if line is None:
            raise _HeadersTooLong(f"WARC headers longer than {MAX_HEADER_BYTES} bytes (skipped to the next record)")
        budget -= len(line)
        if not line or line in (b"\r\n", b"\n"):
            return headers
        key, sep, value = line.partition(b":")
        if sep:
            headers[key.strip().lower()] = value.strip()


def _content_length(headers: dict[bytes, bytes]) -> int | None:
    try:
        n = int(headers[b"content-length"])
        return n if n >= 0 else None
    except (KeyError, ValueError):
        return None


def _document(headers, rtype: bytes, block: bytes, doc_id: str, path: str, offset: int, stats: Stats):
    read_stage = stats.stage("read")
    read_stage.seen += 1
    read_stage.bytes_in += len(block)
    meta = {"url": headers.get(b"warc-target-uri", b"").decode("utf-8", "replace") or None,
            "date": headers.get(b"warc-date", b"").decode("latin-1") or None,
            "source": f"{os.path.basename(path)}@{offset}"}
    if rtype == b"response" and headers.get(b"content-type", b"").lower().startswith(b"application/http"):
        head, sep, body = block.partition(b"\r\n\r\n")
        if not sep:
            head, sep, body = block.partition(b"\n\n")
        status_line, _, header_text = head.partition(b"\n")
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        if status is None:
            stats.error("malformed HTTP response", path, offset, status_line[:80].decode("latin-1"))
            read_stage.dropped["malformed HTTP response"] += 1
            return None
        if status != 200:
            read_stage.dropped[f"HTTP status {status // 100}xx"] += 1
            return None
        ctype = b""
        for hline in header_text.split(b"\n"):
            key, _, value = hline.partition(b":")
            if key.strip().lower() == b"content-type":
                ctype = value.strip()
    else:
        body = block
        ctype = headers.get(b"content-type", b"text/plain" if rtype == b"conversion" else b"")
    mime, charset = parse_content_type(ctype.decode("latin-1"))
    if rtype == b"conversion":
        mime, charset = "text/plain", charset or "utf-8"
    meta.update(content_type=mime, charset=charset)
    read_stage.kept += 1
    read_stage.bytes_kept += len(body)
    return Document(doc_id, "", meta, payload=body)


def parse_content_type(value: str) -> tuple[str, str | None]:
    parts = [p.strip() for p in value.split(";")]
    mime = parts[0].lower() if parts else ""
    charset = None
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k.strip().lower() == "charset" and v.strip():
            charset = v.strip().strip("\"'").lower()
    return mime, charset
