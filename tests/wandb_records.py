"""Read the records of an offline W&B run file (``run-<id>.wandb``) for assertions.

The file is W&B's append-only log: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
records, each with a 7-byte header (crc32, length, type: full / first / middle / last); the
payloads are ``wandb_internal_pb2.Record`` protobufs.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", f"not a W&B run file (header {ident!r})"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # block trailer padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        chunk, pos = data[pos : pos + length], pos + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:  # zero padding at the end of a block
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0


def read_run(path: str | Path) -> dict:
    """{"history": [ {key: value} ...], "config": {key: json}, "files": [paths]} of a run file."""
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    out: dict = {"history": [], "config": {}, "files": []}
    for payload in _payloads(Path(path).read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            out["history"].append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "run":
            out["config"].update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            out["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "files":
            out["files"].extend(f.path for f in record.files.files)
    return out
