"""Task bookkeeping shared by the executors: completion markers, whole-or-nothing writes, memory.

A task writes its outputs whole-or-nothing (``glm_common/storage.py``) and its completion marker last.
A rerun skips every task with a marker, and a task that died half-way simply runs again and
writes the same objects: nothing is duplicated or lost, and the final bytes are the same as an
uninterrupted run's. Each marker also records the task's peak memory (``memory``).
"""

from __future__ import annotations

import gzip
import json
import resource
import sys
from typing import Callable

from glm_common.storage import AtomicFile, Storage

MAX_MARKER_BYTES = 64 * 2**20


def marker_key(stage: str, task: int) -> str:
    return f"markers/{stage}/{task:05d}.json"


def is_done(work: Storage, stage: str, task: int) -> bool:
    return work.exists(marker_key(stage, task))


def done_tasks(work: Storage, stage: str) -> set[int]:
    """The tasks of ``stage`` with a marker (one listing, not a request per task)."""
    names = work.listdir(f"markers/{stage}")
    return {int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()}


def write_marker(work: Storage, stage: str, task: int, payload: dict) -> None:
    work.write_bytes(marker_key(stage, task), json.dumps(payload, sort_keys=True).encode())


def read_marker(work: Storage, stage: str, task: int) -> dict:
    return json.loads(work.read(marker_key(stage, task), max_bytes=MAX_MARKER_BYTES))


def run_once(work: Storage, stage: str, task: int, fn: Callable[[], dict]) -> None:
    """Run a task unless its marker exists; its marker (``fn``'s dict and the task's peak memory)
    is written after everything the task wrote."""
    if is_done(work, stage, task):
        return
    memory = TaskMemory()
    result = fn()
    result["memory"] = memory.report()
    write_marker(work, stage, task, result)


class JsonlGzWriter:
    """Deterministic gzip JSONL (no timestamp or file name in the header), streamed and made visible
    by ``close`` (whole-or-nothing, see ``storage``)."""

    def __init__(self, store: Storage, key: str) -> None:
        self.key, self.file = key, AtomicFile(store, key)
        self.gz = gzip.GzipFile(fileobj=self.file, mode="wb", mtime=0, filename="", compresslevel=6)
        self.count = 0

    def write(self, line: str) -> None:
        self.gz.write(line.encode("utf-8", "surrogatepass") + b"\n")
        self.count += 1

    def close(self) -> None:
        self.gz.close()
        self.file.commit()


class TaskMemory:
    """A task's peak resident memory. Linux resets the process's high-water mark on request
    (``/proc/self/clear_refs``), so a pool worker that ran a bigger task before still reports this
    task's own peak; elsewhere the process's peak so far is reported."""

    def __init__(self) -> None:
        self.resettable = _reset_peak()
        self.start_mb = _status_mb("VmRSS") or 0.0

    def report(self) -> dict:
        peak = _status_mb("VmHWM") if self.resettable else None
        if peak is None:
            scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
        return {
            "peak_rss_mb": round(peak, 1),
            "start_rss_mb": round(self.start_mb, 1),
            "task_mb": round(max(0.0, peak - self.start_mb), 1),
        }


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
