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
from data_pipeline.readers import open_stream
from data_pipeline.recipe import ReaderCfg

READ_ERRORS = (EOFError, OSError, zlib.error)
PAGE_TYPES = {b"response", b"resource", b"conversion"}


class _Counting:
    """A readline/read wrapper that tracks the uncompressed offset."""

    def __init__(self, f) -> None:
        self.f = f
        self.offset = 0

    def readline(self) -> bytes:
        line = self.f.readline()
        self.offset += len(line)
        return line

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        self.offset += len(data)
        return data

    def skip(self, n: int) -> int:
        done = 0
        while done < n:
            chunk = self.read(min(1 << 20, n - done))
            if not chunk:
                break
            done += len(chunk)
        return done


def read_warc(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    name = os.path.basename(path)
    max_bytes = int(cfg.max_record_mb * 2**20)
    read_stage = stats.stage("read")
    stream, close, status = open_stream(path)
    f, early = _Counting(stream), False
    try:
        index, quiet = 0, False
        while True:
            start = f.offset
            try:
                headers = _read_headers(f, path, stats, quiet=quiet)
                quiet = False
                if headers is None:
                    return
                length = _content_length(headers)
                if length is None:
                    stats.error("malformed WARC record", path, start, "missing or invalid Content-Length")
                    quiet = True
                    continue  # _read_headers resynchronises on the next WARC/ line
                rtype = headers.get(b"warc-type", b"").lower()
                if rtype not in PAGE_TYPES:
                    stats.records[rtype.decode("latin-1") or "unknown"] += 1
                    if f.skip(length) < length:
                        stats.error("truncated WARC record", path, start, f"{rtype.decode('latin-1')} record cut short")
                        return
                    continue
                if length > max_bytes:
                    read_stage.seen += 1
                    read_stage.bytes_in += length
                    read_stage.dropped[f"record larger than {cfg.max_record_mb:g} MB"] += 1
                    if f.skip(length) < length:
                        stats.error("truncated WARC record", path, start, "cut short")
                        return
                    continue
                block = f.read(length)
                if len(block) < length:
                    stats.error("truncated WARC record", path, start,
                                f"Content-Length {length} but only {len(block)} bytes before the end")
                    return
            except READ_ERRORS as err:
                stats.error("truncated or corrupt compressed stream", path, f.offset, f"{type(err).__name__}: {err}")
                return
            doc = _document(headers, rtype, block, f"{name}#{index}", path, start, stats)
            index += 1
            if doc is not None:
                try:
                    yield doc
                except GeneratorExit:  # the consumer stopped early (max_docs_per_file)
                    early = True
                    raise
    finally:
        ended = None if early else status()
        if ended:
            stats.error("truncated or corrupt compressed stream", path, f.offset, ended)
        close()


def _read_headers(f: _Counting, path: str, stats: Stats, quiet: bool = False) -> dict[bytes, bytes] | None:
    """Skip to the next ``WARC/`` version line (reporting anything else once) and parse the headers.
    None at the end of the stream."""
    junk_at = None
    while True:
        line = f.readline()
        if not line:
            if junk_at is not None:
                stats.error("malformed WARC record", path, junk_at, "data that is not a WARC record")
            return None
        if line.startswith(b"WARC/"):
            break
        if line.strip() and junk_at is None and not quiet:
            junk_at = f.offset - len(line)
    if junk_at is not None:
        stats.error("malformed WARC record", path, junk_at, "data that is not a WARC record (skipped to the next one)")
    headers: dict[bytes, bytes] = {}
    while True:
        line = f.readline()
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
