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

A Content-Length that lies is caught by the framing: a block must be followed by CRLF CRLF (or the
end), and must not hold the next records whole (``CRLF CRLF WARC/1.`` headers whose own lengths end
exactly at the block's end: a length stretched over them would merge them into one page). Such a
record is skipped and counted, and reading resumes at the next ``WARC/1.`` line -- inside the block
when there is one, so the records it swallowed are read on their own.
"""

from __future__ import annotations

import os
import zlib
from typing import Iterator

from data_pipeline.document import Document, Stats
from data_pipeline.readers.streams import SKIP_CHUNK, error_reason, max_record_bytes, open_stream, read_line
from data_pipeline.recipe import ReaderCfg

READ_ERRORS = (EOFError, OSError, zlib.error)
PAGE_TYPES = {b"response", b"resource", b"conversion"}
MAX_HEADER_BYTES = 1 << 20  # a WARC header block (version line + headers); real ones hold a few KiB
WRONG_LENGTH = "WARC record with a wrong Content-Length"
TRAILER = b"\r\n\r\n"  # what ends every record's block
NEXT_RECORD = TRAILER + b"WARC/1."  # a block's end, then the next record's version line


class _HeadersTooLong(Exception):
    """A WARC header block over ``MAX_HEADER_BYTES`` (an endless header line, or endless headers)."""


class _CutShort(Exception):
    """The stream ends inside a record's content block (``block``: what was read of it, if buffered)."""

    def __init__(self, message: str, block: bytes = b"") -> None:
        super().__init__(message)
        self.block = block


class _Pushback:
    """A binary stream that bytes already read can be given back to (``unread``), read again first."""

    def __init__(self, f) -> None:
        self.f, self.buf, self.pos = f, b"", 0

    def unread(self, data: bytes) -> None:
        self.buf, self.pos = data + self.buf[self.pos :], 0

    def readline(self, size: int = -1) -> bytes:
        if self.pos >= len(self.buf):
            self.buf, self.pos = b"", 0
            return self.f.readline(size)
        stop = len(self.buf) if size < 0 else min(len(self.buf), self.pos + size)
        newline = self.buf.find(b"\n", self.pos, stop)
        end = newline + 1 if newline >= 0 else stop
        line, self.pos = self.buf[self.pos : end], end
        if newline < 0 and end == len(self.buf) and (size < 0 or len(line) < size):
            line += self.f.readline(size - len(line) if size >= 0 else -1)
        return line

    def read(self, n: int) -> bytes:
        if self.pos >= len(self.buf):
            self.buf, self.pos = b"", 0
            return self.f.read(n)
        part = self.buf[self.pos : self.pos + n]
        self.pos += len(part)
        return part + self.f.read(n - len(part)) if len(part) < n else part


class _Counting:
    """Bounded readline / read over the decompressed stream, tracking the uncompressed offset."""

    def __init__(self, f) -> None:
        self.f = _Pushback(f)
        self.offset = 0

    def unread(self, data: bytes) -> None:
        self.f.unread(data)
        self.offset -= len(data)

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
        block_at = f.offset
        try:
            block = _block(f, length, cfg)
            wrong = _misframed(f, block, length)
        except _CutShort as err:
            at = _record_start(err.block)
            if at is None:
                stats.error("truncated WARC record", path, start, str(err))
                return
            block, wrong = err.block, (f"{err}, over a record inside it", at)
        if wrong is not None:
            detail, at = wrong
            if at is not None:  # the records it swallowed are read on their own
                f.unread(block[at:])
            where = f"offset {block_at + at}" if at is not None else "the next WARC/1. line"
            stats.error(WRONG_LENGTH, path, start, f"{detail}: record skipped, reading resumes at {where}")
            quiet = True  # what lies between is part of the bad record, already counted
            continue
        rtype = headers.get(b"warc-type", b"").lower()
        if rtype not in PAGE_TYPES:
            stats.records[rtype.decode("latin-1") or "unknown"] += 1
            continue
        if block is None:
            read_stage = stats.stage("read")
            read_stage.seen += 1
            read_stage.bytes_in += length
            read_stage.dropped[f"record larger than {cfg.max_record_mb:g} MB"] += 1
            continue
        doc = _document(headers, rtype, block, f"{name}#{index}", path, start, stats)
        index += 1
        if doc is not None:
            yield doc


def _block(f: _Counting, length: int, cfg: ReaderCfg) -> bytes | None:
    """A record's content block; None for one over ``reader.max_record_mb`` (skipped, never buffered)."""
    if length > max_record_bytes(cfg):
        if f.skip(length) < length:
            raise _CutShort(f"Content-Length {length} but the file ends first")
        return None
    block = f.read(length)
    if len(block) < length:
        raise _CutShort(f"Content-Length {length} but only {len(block)} bytes before the end", block)
    return block


def _misframed(f: _Counting, block: bytes | None, length: int) -> tuple[str, int | None] | None:
    """None when the block just read is its record's content, all of it and only it; else why not
    and where in the block the next record starts (None: not in it, read on from the stream)."""
    if block is not None:
        at = _records_to_the_end(block)
        if at is not None:
            return f"Content-Length {length} runs over the next record(s) to their very end", at
    tail = f.read(len(TRAILER))
    if tail == TRAILER or (len(tail) < len(TRAILER) and TRAILER.startswith(tail)):  # ... or the end
        return None
    if tail.startswith(b"\n\n"):  # bare newlines: a lenient writer's
        f.unread(tail[2:])
        return None
    f.unread(tail)
    return f"Content-Length {length} does not end at a record boundary (no CRLF CRLF after the block)", _record_start(
        block
    )


def _record_start(block: bytes | None) -> int | None:
    """Where the first ``WARC/1.`` line inside ``block`` starts, if any."""
    found = block.find(b"\nWARC/1.") if block else -1
    return found + 1 if found >= 0 else None


def _records_to_the_end(block: bytes) -> int | None:
    """Where a chain of whole records starts inside ``block`` (``CRLF CRLF WARC/1.``, headers, their own
    Content-Length of bytes, and so on) that ends exactly at the block's end: the mark of a length
    stretched over the records after it. Content that merely holds WARC records (an archived WARC
    file ends in CRLF CRLF) does not end exactly there. Each position is walked once."""
    known: dict[int, bool] = {}
    found = block.find(NEXT_RECORD)
    while found >= 0:
        at, path, to_end = found + len(TRAILER), [], None
        while to_end is None:
            if at in known:
                to_end = known[at]
                break
            path.append(at)
            head_end = block.find(TRAILER, at)
            size = _content_length(_parse_headers(block[at:head_end])) if head_end >= 0 else None
            end = head_end + len(TRAILER) + size if size is not None else -1
            if end == len(block) or end < 0 or not block.startswith(NEXT_RECORD, end):
                to_end = end == len(block)
            at = end + len(TRAILER)
        known.update(dict.fromkeys(path, to_end))
        if to_end:
            return found + len(TRAILER)
        found = block.find(NEXT_RECORD, found + 1)
    return None


def _parse_headers(head: bytes) -> dict[bytes, bytes]:
    """The ``Name: value`` lines after the version line of a header block held in memory."""
    headers: dict[bytes, bytes] = {}
    for line in head.split(b"\n")[1:]:
        _add_header(headers, line)
    return headers


def _add_header(headers: dict[bytes, bytes], line: bytes) -> None:
    key, sep, value = line.partition(b":")
    if sep:
        headers[key.strip().lower()] = value.strip()


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
        _add_header(headers, line)


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
    meta = {
        "url": headers.get(b"warc-target-uri", b"").decode("utf-8", "replace") or None,
        "date": headers.get(b"warc-date", b"").decode("latin-1") or None,
        "source": f"{os.path.basename(path)}@{offset}",
    }
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
