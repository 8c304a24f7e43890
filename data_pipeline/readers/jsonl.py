"""JSONL (.gz/.zst/...), Parquet and plain-text readers."""
from __future__ import annotations

import json
import os
import zlib
from typing import Iterator

import fsspec

from data_pipeline.document import Document, Stats
from data_pipeline.readers import open_stream
from data_pipeline.recipe import ReaderCfg

try:
    from zstandard import ZstdError
except ImportError:  # pragma: no cover
    ZstdError = OSError
READ_ERRORS = (EOFError, OSError, zlib.error, ZstdError)


def _meta(record: dict, cfg: ReaderCfg) -> dict:
    return {k: v for k, v in record.items() if k not in (cfg.text_field, cfg.id_field)}


def read_jsonl(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    name = os.path.basename(path)
    max_bytes = int(cfg.max_record_mb * 2**20)
    stage = stats.stage("read")
    lineno = 0
    f, close, status = open_stream(path)
    try:
        with f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                stage.seen += 1
                stage.bytes_in += len(line)
                if len(line) > max_bytes:
                    stage.dropped[f"record larger than {cfg.max_record_mb:g} MB"] += 1
                    continue
                try:
                    record = json.loads(line)
                except UnicodeDecodeError as err:
                    stats.error("undecodable bytes", path, lineno, str(err))
                    stage.dropped["undecodable bytes"] += 1
                    continue
                except json.JSONDecodeError as err:
                    stats.error("malformed JSON", path, lineno, str(err))
                    stage.dropped["malformed JSON"] += 1
                    continue
                text = record.get(cfg.text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    stats.error("missing text field", path, lineno, f"no string field {cfg.text_field!r}")
                    stage.dropped["missing text field"] += 1
                    continue
                doc_id = record.get(cfg.id_field)
                doc_id = str(doc_id) if doc_id is not None else f"{name}:{lineno}"
                meta = _meta(record, cfg)
                meta.setdefault("source", f"{name}:{lineno}")
                stage.kept += 1
                stage.bytes_kept += len(line)
                yield Document(doc_id, text, meta)
    except READ_ERRORS as err:
        stats.error("truncated or corrupt compressed stream", path, lineno + 1, f"{type(err).__name__}: {err}")
    else:
        if status():
            stats.error("truncated or corrupt compressed stream", path, lineno + 1, status())
    finally:
        close()


def read_parquet(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    import pyarrow.parquet as pq

    name = os.path.basename(path)
    stage = stats.stage("read")
    row = 0
    try:
        with fsspec.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            if cfg.text_field not in pf.schema_arrow.names:
                stats.error("missing text field", path, 0,
                            f"no column {cfg.text_field!r} (columns: {pf.schema_arrow.names})")
                return
            for batch in pf.iter_batches(batch_size=1024):
                for record in batch.to_pylist():
                    row += 1
                    stage.seen += 1
                    text = record.get(cfg.text_field)
                    if not isinstance(text, str):
                        stats.error("missing text field", path, row, f"row has no string {cfg.text_field!r}")
                        stage.dropped["missing text field"] += 1
                        continue
                    stage.bytes_in += len(text)
                    doc_id = record.get(cfg.id_field)
                    meta = {k: v for k, v in _meta(record, cfg).items() if _jsonable(v)}
                    meta.setdefault("source", f"{name}:{row}")
                    stage.kept += 1
                    stage.bytes_kept += len(text)
                    yield Document(str(doc_id) if doc_id is not None else f"{name}:{row}", text, meta)
    except (OSError, ValueError) as err:  # pyarrow raises ArrowInvalid (a ValueError) on a damaged file
        stats.error("corrupt Parquet file", path, row, f"{type(err).__name__}: {err}")


def _jsonable(v) -> bool:
    return isinstance(v, (str, int, float, bool, type(None), list, dict))


def read_text(path: str, cfg: ReaderCfg, stats: Stats) -> Iterator[Document]:
    stage = stats.stage("read")
    try:
        with fsspec.open(path, "rb", compression="infer") as f:
            data = f.read()
    except READ_ERRORS as err:
        stats.error("truncated or corrupt compressed stream", path, 0, f"{type(err).__name__}: {err}")
        return
    stage.seen += 1
    stage.bytes_in += len(data)
    text = data.decode("utf-8", "replace")
    stage.kept += 1
    stage.bytes_kept += len(data)
    yield Document(os.path.basename(path), text, {"source": os.path.basename(path)})
