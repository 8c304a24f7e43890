"""Task bookkeeping shared by the executors: completion markers and atomic file writes.

A task writes its outputs under temporary names, renames them into place, and writes its
completion marker last. A rerun skips every task with a marker, and a task that died half-way
simply runs again and overwrites its temporary files: nothing is duplicated or lost, and the
final bytes are the same as an uninterrupted run's.
"""
from __future__ import annotations

import gzip
import json
import os
from contextlib import contextmanager


def marker_path(work: str, stage: str, task: int) -> str:
    return os.path.join(work, "markers", stage, f"{task:05d}.json")


def is_done(work: str, stage: str, task: int) -> bool:
    return os.path.exists(marker_path(work, stage, task))


def write_marker(work: str, stage: str, task: int, payload: dict) -> None:
    atomic_write_bytes(marker_path(work, stage, task), json.dumps(payload, sort_keys=True).encode())


def read_marker(work: str, stage: str, task: int) -> dict:
    with open(marker_path(work, stage, task)) as f:
        return json.load(f)


def atomic_write_bytes(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextmanager
def atomic_open(path: str):
    """A binary file that appears at ``path`` only when the block completes."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class JsonlGzWriter:
    """Deterministic gzip JSONL (no timestamp or file name in the header), streamed to a temporary
    file and renamed into place by ``close``."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path, self.tmp = path, f"{path}.tmp.{os.getpid()}"
        self.raw = open(self.tmp, "wb")
        self.gz = gzip.GzipFile(fileobj=self.raw, mode="wb", mtime=0, filename="", compresslevel=6)
        self.count = 0

    def write(self, line: str) -> None:
        self.gz.write(line.encode("utf-8", "surrogatepass") + b"\n")
        self.count += 1

    def close(self) -> None:
        self.gz.close()
        self.raw.flush()
        os.fsync(self.raw.fileno())
        self.raw.close()
        os.replace(self.tmp, self.path)
