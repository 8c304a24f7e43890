"""The unit every pipeline stage passes on, and the counters every stage keeps.

A :class:`Document` is one page or record: a stable id (input file + record position), its text
(the raw payload before extraction, clean text after) and metadata (URL, date, content type,
charset, language and score, ...). Stages are generators over documents; a stage that drops a
document calls :meth:`Stats.drop` with a reason, so the funnel always adds up:
``seen == kept + sum(dropped)`` for every stage.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Document:
    id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)
    payload: bytes | None = None  # raw bytes before extraction (WARC responses); cleared after

    def to_json(self, **extra: Any) -> str:
        return json.dumps({"id": self.id, "text": self.text, **self.meta, **extra}, ensure_ascii=False, sort_keys=False)


@dataclass
class StageStats:
    seen: int = 0
    kept: int = 0
    bytes_in: int = 0
    bytes_kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {
            "seen": self.seen,
            "kept": self.kept,
            "bytes_in": self.bytes_in,
            "bytes_kept": self.bytes_kept,
            "dropped": dict(sorted(self.dropped.items())),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "StageStats":
        return cls(d["seen"], d["kept"], d["bytes_in"], d["bytes_kept"], Counter(d["dropped"]))

    def add(self, other: "StageStats") -> None:
        self.seen += other.seen
        self.kept += other.kept
        self.bytes_in += other.bytes_in
        self.bytes_kept += other.bytes_kept
        self.dropped.update(other.dropped)


class Stats:
    """Per-stage counters, in stage order, plus input errors (file, offset, reason)."""

    MAX_ERRORS_LISTED = 200  # per task; all are counted, the first ones are listed with their place

    def __init__(self) -> None:
        self.stages: dict[str, StageStats] = {}
        self.errors: list[dict] = []
        self.error_count: Counter = Counter()
        self.languages: Counter = Counter()
        self.records: Counter = Counter()  # WARC records that are not pages, by WARC-Type

    def stage(self, name: str) -> StageStats:
        return self.stages.setdefault(name, StageStats())

    def error(self, reason: str, file: str, offset: int | None = None, detail: str = "") -> None:
        self.error_count[reason] += 1
        if len(self.errors) < self.MAX_ERRORS_LISTED:
            self.errors.append({"reason": reason, "file": file, "offset": offset, "detail": detail[:300]})

    def to_dict(self) -> dict:
        return {
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "input_errors": dict(sorted(self.error_count.items())),
            "input_error_examples": self.errors,
            "languages": dict(ranked(self.languages)),
            "other_records": dict(sorted(self.records.items())),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Stats":
        s = cls()
        s.stages = {k: StageStats.from_dict(v) for k, v in d["stages"].items()}
        s.error_count = Counter(d["input_errors"])
        s.errors = list(d["input_error_examples"])
        s.languages = Counter(d["languages"])
        s.records = Counter(d.get("other_records", {}))
        return s

    def merge(self, other: "Stats") -> None:
        for name, st in other.stages.items():
            self.stage(name).add(st)
        self.error_count.update(other.error_count)
        self.errors.extend(other.errors[: max(0, self.MAX_ERRORS_LISTED - len(self.errors))])
        self.languages.update(other.languages)
        self.records.update(other.records)


def ranked(counts: Counter, n: int | None = None) -> list[tuple[str, int]]:
    """The ``n`` most common (all: None), ties by name: the same order whatever order the counts
    were merged in (a resumed run merges its tasks in another order than an uninterrupted one)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
