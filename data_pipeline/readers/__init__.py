"""Input readers: WARC/WET, JSONL (.gz/.zst), Parquet and plain text, from paths, globs or any
fsspec URL. Every reader yields :class:`Document` s and reports a bad record or a damaged file to
``Stats.error`` with the file, the offset (byte offset in the uncompressed stream, or line/row
number) and the reason, then goes on with the next record (or, for a truncated file, stops that
file after everything readable)."""
from __future__ import annotations

import io
import zlib
from typing import Iterator

import fsspec

from data_pipeline.document import Document, Stats
from data_pipeline.recipe import ReaderCfg

FORMATS = {".warc": "warc", ".wet": "warc", ".arc": "warc", ".jsonl": "jsonl", ".json": "jsonl",
           ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text", ".text": "text", ".md": "text"}
COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")


def expand_inputs(patterns: list[str]) -> list[str]:
    """Every file the patterns name, sorted, as full URLs. A pattern that matches nothing stops
    the run at once (a typo must not produce an empty corpus)."""
    files: list[str] = []
    for pattern in patterns:
        fs, path = fsspec.core.url_to_fs(pattern)
        if fs.isdir(path):
            matches = [p for p in fs.find(path) if format_of(p, "auto", strict=False)]
        elif any(ch in path for ch in "*?["):
            matches = fs.glob(path)
        else:
            matches = [path] if fs.exists(path) else []
        if not matches:
            raise FileNotFoundError(f"input {pattern!r} matches no file")
        files.extend(fs.unstrip_protocol(m) if fs.protocol not in ("file", ("file", "local")) else m
                     for m in matches)
    return sorted(dict.fromkeys(files))


def format_of(path: str, configured: str = "auto", *, strict: bool = True) -> str | None:
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
        raise ValueError(f"cannot tell the format of {path!r} from its name; set reader.format")
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


class GzipStream(io.RawIOBase):
    """Multi-member gzip decompression that delivers every byte before a truncation or corruption
    (Python's ``gzip`` raises on a cut stream and loses the data of that read); ``truncated`` and
    ``error`` say how the stream ended."""

    def __init__(self, raw) -> None:
        self.raw = raw
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.pending = b""
        self.member_started = False
        self.truncated = False
        self.error: str | None = None
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self.pending and not self.done:
            chunk = self.z.unused_data if self.z.eof else b""
            if self.z.eof:
                self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self.member_started = False
            if not chunk:
                chunk = self.raw.read(1 << 16)
            if not chunk:
                self.done = True
                self.truncated = self.member_started and not self.z.eof
                break
            try:
                self.pending = self.z.decompress(chunk)
            except zlib.error as err:
                self.done, self.error = True, f"corrupt gzip data: {err}"
                break
            self.member_started = True
        n = min(len(buf), len(self.pending))
        buf[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def open_stream(path: str):
    """(file-like binary stream, closer, status) for a possibly compressed file. ``status()``
    returns None or why the stream ended early (truncated / corrupt)."""
    f = fsspec.open(path, "rb").open()
    name = path.lower()
    if name.endswith(".gz"):
        gz = GzipStream(f)
        stream = io.BufferedReader(gz, 1 << 16)

        def status() -> str | None:
            return gz.error or ("gzip stream ends in the middle of a member (truncated file)" if gz.truncated else None)
        return stream, f.close, status
    if name.endswith(".zst"):
        import zstandard

        stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True), 1 << 16)
        return stream, f.close, lambda: None
    if name.endswith((".bz2", ".xz")):
        stream = fsspec.open(path, "rb", compression="infer").open()
        return stream, stream.close, lambda: None
    return f, f.close, lambda: None


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
