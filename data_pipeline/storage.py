"""Where a pipeline run writes: a local directory or any fsspec URL (``s3://``, ``gs://``, ``memory://``).

Every object a task writes appears whole or not at all. A local file is written under a temporary
name, flushed to disk and renamed. Object stores have no rename, but an object becomes visible only
when its upload completes (a single PUT, or the completion of a multipart upload), so a task writes
each object straight to its own task-unique key; a task that fails discards the upload, and a task
that is killed never completes it. Readers of a run's output go through its manifest, written last
(``data_pipeline/manifest.py``), never through a listing.

Reads are bounded: whole objects only where the caller gives a size limit, otherwise byte ranges.
"""
from __future__ import annotations

import os
import posixpath
from contextlib import contextmanager
from typing import IO, Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from data_pipeline.remote import check_scheme
from glm_common.durable import fsync_dir, sync_file


def is_url(location: str) -> bool:
    return "://" in location or "::" in location


class AtomicFile:
    """A binary file that appears at its key on :meth:`commit` and never otherwise."""

    def __init__(self, store: "Store", key: str) -> None:
        self.path = store.path(key)
        self.local = store.local
        if self.local:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.tmp = f"{self.path}.tmp.{os.getpid()}"
            self.f: IO[bytes] = open(self.tmp, "wb")
        else:
            self.f = store.fs.open(self.path, "wb")

    def write(self, data: bytes) -> int:
        return self.f.write(data)

    def tell(self) -> int:
        return self.f.tell()

    def commit(self) -> None:
        if self.local:
            sync_file(self.f)
            self.f.close()
            os.replace(self.tmp, self.path)
            fsync_dir(os.path.dirname(self.path))
        else:
            self.f.close()  # completes the upload: the object appears now, whole

    def abort(self) -> None:
        if self.local:
            self.f.close()
            os.unlink(self.tmp)
        elif hasattr(self.f, "discard"):
            self.f.discard()  # fsspec's buffered files: drop the buffer, abort a multipart upload
            self.f.closed = True  # and never upload it when garbage-collected


class Store:
    """A directory-like location: keys are ``/``-separated paths below its root."""

    def __init__(self, location: str) -> None:
        check_scheme(location, "output")
        if is_url(location):
            self.fs, self.root = fsspec.core.url_to_fs(location, use_listings_cache=False, skip_instance_cache=True)
            self.root = self.root.rstrip("/")
        else:
            self.fs, self.root = LocalFileSystem(), os.path.abspath(location)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.url = self.root if self.local else self.fs.unstrip_protocol(self.root)

    def __reduce__(self):  # a worker process opens its own filesystem (no sockets or locks pickled)
        return Store, (self.url,)

    def child(self, key: str) -> "Store":
        return Store(self.path(key))

    def path(self, key: str) -> str:
        """The full path (local) or URL of ``key``."""
        if self.local:
            return os.path.join(self.root, *key.split("/"))
        return self.fs.unstrip_protocol(posixpath.join(self.root, key))

    def _fs_path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/")) if self.local else posixpath.join(self.root, key)

    def exists(self, key: str) -> bool:
        return os.path.exists(self._fs_path(key)) if self.local else self.fs.exists(self._fs_path(key))

    def list(self, key: str) -> list[str]:
        """The names directly under ``key`` (none if it does not exist). For the run's own bookkeeping
        (completion markers), never for finding its output."""
        path = self._fs_path(key)
        if self.local:
            return sorted(os.listdir(path)) if os.path.isdir(path) else []
        try:
            return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False, refresh=True))
        except FileNotFoundError:
            return []

    def remove_orphans(self) -> list[str]:
        """Delete the ``NAME.tmp.PID`` files that killed writers left (local stores only: an object
        store never shows an unfinished upload). Only when no task of the run is writing: the
        manifest writers call it just before the manifest. Returns the keys removed."""
        if not self.local:
            return []
        removed = []
        for folder, _, names in os.walk(self.root):
            for name in names:
                stem, dot, pid = name.rpartition(".")
                if dot and pid.isdigit() and stem.endswith(".tmp"):
                    os.unlink(os.path.join(folder, name))
                    removed.append(os.path.relpath(os.path.join(folder, name), self.root).replace(os.sep, "/"))
        return sorted(removed)

    def read_bytes(self, key: str, max_bytes: int) -> bytes:
        """A whole object, refused past ``max_bytes`` (a marker, an index, a per-file list)."""
        with self.open(key) as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError(f"{self.path(key)} is larger than {max_bytes} bytes: not the file expected here")
        return data

    def open(self, key: str) -> IO[bytes]:
        """A binary reader (streamed: the caller bounds what it buffers)."""
        path = self._fs_path(key)
        return open(path, "rb") if self.local else self.fs.open(path, "rb")

    def read_ranges(self, keys: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
        """Bytes ``[start, end)`` of each key; remote ranges are fetched concurrently."""
        if not self.local:
            wanted = [i for i in range(len(keys)) if ends[i] > starts[i]]
            got = self.fs.cat_ranges([self._fs_path(keys[i]) for i in wanted], [starts[i] for i in wanted],
                                     [ends[i] for i in wanted], on_error="raise") if wanted else []
            out = [b""] * len(keys)
            for i, data in zip(wanted, got):
                out[i] = data
            return out
        out = []
        for key, start, end in zip(keys, starts, ends):
            if end <= start:
                out.append(b"")
                continue
            with open(self._fs_path(key), "rb") as f:
                f.seek(start)
                out.append(f.read(end - start))
        return out

    def write_bytes(self, key: str, data: bytes) -> None:
        with self.open_write(key) as f:
            f.write(data)

    @contextmanager
    def open_write(self, key: str) -> Iterator[AtomicFile]:
        """A binary file that appears at ``key`` only if the block completes."""
        f = AtomicFile(self, key)
        try:
            yield f
        except BaseException:
            f.abort()
            raise
        f.commit()
