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

from typing import Iterator

import fsspec

from data_pipeline.document import Document, Stats
from data_pipeline.errors import PipelineError
from data_pipeline.recipe import ReaderCfg
from data_pipeline.remote import RemoteReadError, check_host, check_scheme, retrying, storage_options

FORMATS = {
    ".warc": "warc",
    ".wet": "warc",
    ".arc": "warc",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
    ".md": "text",
}
COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")


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
    if (
        pattern.lower().startswith(("http://", "https://"))
        and not pattern.endswith("/")
        and not any(ch in pattern for ch in "*?[")
    ):
        return [pattern]
    fs, path = fsspec.core.url_to_fs(
        pattern,
        **storage_options(
            pattern, connect_timeout_s=cfg.http_connect_timeout_s, read_timeout_s=cfg.http_read_timeout_s
        ),
    )
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
        raise PipelineError(
            f"input {path}: cannot tell its format from its name (accepted: {names}, each optionally "
            f"compressed as {', '.join(COMPRESSIONS)}); rename it or set reader.format="
            f"{'|'.join(sorted(set(FORMATS.values())))}"
        )
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
