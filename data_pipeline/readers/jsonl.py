"""JSONL (.gz/.zst/...), Parquet and plain-text readers, each record bounded by ``reader.max_record_mb``."""

from __future__ import annotations

import json
import os
import zlib
from typing import Iterator

from data_pipeline.document import Document, Stats
from data_pipeline.readers.streams import (
    RATIO_ALLOWANCE,
    DecompressionRatioError,
    error_reason,
    max_record_bytes,
    open_stream,
    read_line,
)
from data_pipeline.recipe import ReaderCfg
from data_pipeline.remote import open_url

try:
    from zstandard import ZstdError
except ImportError:  # pragma: no cover
    ZstdError = OSError
READ_ERRORS = (EOFError, OSError, zlib.error, ZstdError)
PARQUET_BATCH_BYTES = 64 << 20  # Parquet rows decoded at a time, by the row group's mean row size


def _meta(record: dict, cfg: ReaderCfg) -> dict:
    return {k: v for k, v in record.items() if k not in (cfg.text_field, cfg.id_field)}


def read_jsonl(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    """One document per line; each line read with the ``reader.max_record_mb`` cap."""
    name, limit = os.path.basename(path), max_record_bytes(cfg)
    stage = stats.stage("read")
    lineno, close = 0, None
    try:
        f, close, status = open_stream(path, cfg)
        with f:
            while True:
                line, size = read_line(f, limit)
                if not size:
                    break
                lineno += 1
                if line is not None and not line.endswith(b"\n") and status():
                    break  # the cut end of a truncated stream: reported once, below
                if line is not None and not line.strip():
                    continue
                stage.seen += 1
                stage.bytes_in += size
                if line is None:
                    stage.dropped[f"record larger than {cfg.max_record_mb:g} MB"] += 1
                    continue
                doc = _document(line, f"{name}:{lineno}", path, lineno, cfg, stats)
                if doc is not None:
                    stage.kept += 1
                    stage.bytes_kept += size
                    yield doc
    except READ_ERRORS as err:
        stats.error(error_reason(err), path, lineno + 1, f"{type(err).__name__}: {err}")
    else:
        if status():
            stats.error("truncated or corrupt compressed stream", path, lineno + 1, status())
    finally:
        if close is not None:
            close()


def _document(line: bytes, place: str, path: str, lineno: int, cfg: ReaderCfg, stats: Stats) -> Document | None:
    """The document of one JSON line, or None after counting why there is none."""
    stage = stats.stage("read")
    try:
        record = json.loads(line)
    except UnicodeDecodeError as err:
        stats.error("undecodable bytes", path, lineno, str(err))
        stage.dropped["undecodable bytes"] += 1
        return None
    except json.JSONDecodeError as err:
        stats.error("malformed JSON", path, lineno, str(err))
        stage.dropped["malformed JSON"] += 1
        return None
    text = record.get(cfg.text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        stats.error("missing text field", path, lineno, f"no string field {cfg.text_field!r}")
        stage.dropped["missing text field"] += 1
        return None
    if b"\\u" in line and _lone_surrogate(record):
        stats.error("undecodable bytes", path, lineno, "a \\uD800-\\uDFFF escape that is half of a pair (no UTF-8)")
        stage.dropped["undecodable bytes"] += 1
        return None
    doc_id = record.get(cfg.id_field) if cfg.id_field else None
    meta = _meta(record, cfg)
    meta.setdefault("source", place)
    return Document(str(doc_id) if doc_id is not None else place, text, meta)


def _lone_surrogate(record: dict) -> bool:
    """JSON may escape half a UTF-16 pair (``"\\ud800"``): a string no UTF-8 file can hold, which the
    stages after the reader would fail on (the whole run, for one record)."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_parquet(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    """One document per row. Parquet inflates a row group's pages at once, so memory is bounded from
    the file's metadata before anything is decoded: a row group inflating beyond
    ``reader.max_decompression_ratio`` is an input error, rows are read in batches of about
    ``PARQUET_BATCH_BYTES``, and a row whose text exceeds ``reader.max_record_mb`` is dropped and
    counted from its length, without becoming a Python string."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    name, limit = os.path.basename(path), max_record_bytes(cfg)
    stage = stats.stage("read")
    row = 0
    try:
        with open_url(
            path,
            "rb",
            connect_timeout_s=cfg.http_connect_timeout_s,
            read_timeout_s=cfg.http_read_timeout_s,
            retries=cfg.http_retries,
        ) as f:
            pf = pq.ParquetFile(f, pre_buffer=False)
            if cfg.text_field not in pf.schema_arrow.names:
                stats.error(
                    "missing text field", path, 0, f"no column {cfg.text_field!r} (columns: {pf.schema_arrow.names})"
                )
                return
            for group in range(pf.metadata.num_row_groups):
                meta = pf.metadata.row_group(group)
                packed = sum(meta.column(c).total_compressed_size for c in range(meta.num_columns))
                if meta.total_byte_size > cfg.max_decompression_ratio * packed + RATIO_ALLOWANCE:
                    raise DecompressionRatioError(
                        f"row group {group} inflates to {meta.total_byte_size} bytes from {packed}, more than "
                        f"reader.max_decompression_ratio={cfg.max_decompression_ratio:g} times + "
                        f"{RATIO_ALLOWANCE >> 20} MiB (a bomb?); raise the limit if the file is genuine"
                    )
                if meta.total_byte_size > cfg.max_row_group_mb * 2**20:
                    stage.seen += meta.num_rows
                    stage.dropped[f"Parquet row group larger than {cfg.max_row_group_mb:g} MB"] += meta.num_rows
                    row += meta.num_rows
                    continue
                per_row = meta.total_byte_size / max(meta.num_rows, 1)
                rows = max(1, min(1024, int(PARQUET_BATCH_BYTES // max(per_row, 1))))
                for batch in pf.iter_batches(batch_size=rows, row_groups=[group]):
                    column, num_rows = batch.column(cfg.text_field), batch.num_rows
                    kept = range(num_rows)
                    if _is_text(column.type):
                        lengths = pc.fill_null(pc.binary_length(column), 0)
                        small = pc.less_equal(lengths, limit)
                        kept = pc.indices_nonzero(small).to_pylist()
                        big = num_rows - len(kept)
                        if big:
                            stage.seen += big
                            stage.bytes_in += pc.sum(pc.if_else(small, 0, lengths)).as_py()
                            stage.dropped[f"record larger than {cfg.max_record_mb:g} MB"] += big
                        batch = batch.filter(small)
                    for i, record in zip(kept, batch.to_pylist()):
                        stage.seen += 1
                        doc = _parquet_document(record, f"{name}:{row + i + 1}", path, row + i + 1, cfg, stats)
                        if doc is not None:
                            yield doc
                    row += num_rows
    except (OSError, ValueError) as err:  # pyarrow raises ArrowInvalid (a ValueError) on a damaged file
        stats.error(error_reason(err, "corrupt Parquet file"), path, row, f"{type(err).__name__}: {err}")


def _is_text(arrow_type) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
    )


def _parquet_document(record: dict, place: str, path: str, row: int, cfg: ReaderCfg, stats: Stats) -> Document | None:
    stage = stats.stage("read")
    text = record.get(cfg.text_field)
    if not isinstance(text, str):
        stats.error("missing text field", path, row, f"row has no string {cfg.text_field!r}")
        stage.dropped["missing text field"] += 1
        return None
    stage.bytes_in += len(text)
    doc_id = record.get(cfg.id_field) if cfg.id_field else None
    meta = {k: v for k, v in _meta(record, cfg).items() if _jsonable(v)}
    meta.setdefault("source", place)
    stage.kept += 1
    stage.bytes_kept += len(text)
    return Document(str(doc_id) if doc_id is not None else place, text, meta)


def _jsonable(v) -> bool:
    return isinstance(v, (str, int, float, bool, type(None), list, dict))


def read_text(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    """The whole file as one document; at most ``reader.max_record_mb`` + 1 byte is read."""
    stage = stats.stage("read")
    limit, close = max_record_bytes(cfg), None
    try:
        f, close, status = open_stream(path, cfg)
        data = f.read(limit + 1)
    except READ_ERRORS as err:
        stats.error(error_reason(err), path, 0, f"{type(err).__name__}: {err}")
        return
    finally:
        if close is not None:
            close()
    if len(data) <= limit and status():
        stats.error("truncated or corrupt compressed stream", path, len(data), status())
        return
    stage.seen += 1
    stage.bytes_in += len(data)
    if len(data) > limit:
        stage.dropped[f"record larger than {cfg.max_record_mb:g} MB"] += 1
        return
    stage.kept += 1
    stage.bytes_kept += len(data)
    yield Document(os.path.basename(path), data.decode("utf-8", "replace"), {"source": os.path.basename(path)})
