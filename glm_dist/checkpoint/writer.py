"""Asynchronous checkpoint writes: a rank's files go out from host memory on a background thread
while training continues, and the checkpoint is committed once every rank's files are complete.

Each rank's thread writes its files into the save's staging folder, then a marker
``.done/rank<r>.json`` listing them with their sizes and block SHA-256s (or the error that
stopped it). Rank 0's thread then waits for every rank's marker and calls ``commit`` (meta.json
written last, the folder published, ``latest`` moved). Nothing here calls a collective: the
main threads agree on failures at the next wait (``train/checkpoint.py``), with ``comm.first_error``.
A process killed mid-write leaves no marker, so no commit: the previous checkpoint stays the latest.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from glm_common.storage import Storage
from glm_dist.checkpoint import tensorfile
from glm_dist.checkpoint.files import MAX_JSON_BYTES, BlockHasher, entry_of, parse_json

DONE = ".done"
POLL_S = 0.2


@dataclass
class RankFiles:
    """What one rank writes for one checkpoint, already in host memory."""

    rank: int
    tensors: dict[str, list[tuple[str, torch.Tensor]]] = field(default_factory=dict)  # file -> (key, tensor)
    blobs: dict[str, bytes] = field(default_factory=dict)  # file -> bytes (JSON, the tokenizer)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.tensors.values() for _, t in ts) + sum(
            len(b) for b in self.blobs.values()
        )


class Aborted(Exception):
    pass


def hash_file(storage: Storage, rel: str) -> dict:
    """The meta.json entry of a file already written (read back in pieces)."""
    hasher = BlockHasher()
    for piece in storage.chunks(rel, 0, storage.size(rel), purpose="hash"):
        hasher.update(piece)
    return hasher.entry()


def failure(what: str, rank: int, err: BaseException, storage: Storage) -> str:
    """One line: what failed where, and the free space under the checkpoint folder."""
    first = str(err).splitlines()[0] if str(err) else ""
    free = storage.free_bytes()
    room = f"; {free / 2**20:.1f} MiB free under {storage}" if free is not None else f" under {storage}"
    return f"{what} failed on rank {rank} ({type(err).__name__}: {first[:200]}{room})"


class AsyncSave:
    """The background half of one save on one rank."""

    def __init__(
        self,
        staging: Storage,
        files: RankFiles,
        *,
        world: int,
        what: str,
        root: Storage,
        commit: Callable[[dict], None] | None = None,
    ):
        self.staging, self.files, self.world, self.what, self.root = staging, files, world, what, root
        self.commit = commit
        self.written, self.abort = threading.Event(), threading.Event()
        self.error: str | None = None  # this rank's writes
        self.commit_error: str | None = None  # rank 0's commit
        self.seconds = {"write": 0.0, "commit": 0.0}
        self.thread = threading.Thread(target=self._run, name=f"checkpoint-writer-{files.rank}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            marker = {"files": self._write()}
        except Exception as err:  # reported at the next wait, on every rank
            self.error = failure(self.what, self.files.rank, err, self.root)
            marker = {"error": self.error}
        try:
            self.staging.write_bytes(f"{DONE}/rank{self.files.rank:05d}.json", json.dumps(marker).encode())
        except Exception as err:
            self.error = self.error or failure(self.what, self.files.rank, err, self.root)
        finally:
            self.seconds["write"] = time.perf_counter() - t0
            self.written.set()
        if self.commit is None or self.error is not None:
            return
        t1 = time.perf_counter()
        try:
            self.commit(self._markers())
        except Aborted:
            pass
        except Exception as err:
            self.commit_error = failure(f"committing {self.what[len('writing ') :]}", self.files.rank, err, self.root)
        self.seconds["commit"] = time.perf_counter() - t1

    def _write(self) -> dict:
        entries = {}
        for rel, tensors in self.files.tensors.items():
            entries[rel] = tensorfile.write(self.staging, rel, tensors)
        for rel, data in self.files.blobs.items():
            self.staging.write_bytes(rel, data)
            entries[rel] = entry_of(data)
        return entries

    def _markers(self) -> dict:
        """Every rank's file entries, once all have written their marker (rank 0)."""
        while True:
            names = [n for n in self.staging.listdir(DONE) if n.startswith("rank") and n.endswith(".json")]
            if len(names) >= self.world:
                break
            if self.abort.wait(POLL_S):
                raise Aborted
        entries = {}
        for name in sorted(names):
            marker = parse_json(self.staging.read(f"{DONE}/{name}", max_bytes=MAX_JSON_BYTES), name)
            if "error" in marker:
                raise RuntimeError(marker["error"])
            entries.update(marker["files"])
        return entries

    def wait_written(self) -> None:
        self.written.wait()

    def finish(self, *, abort: bool) -> None:
        if abort:
            self.abort.set()
        self.thread.join()
