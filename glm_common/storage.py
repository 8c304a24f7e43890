"""Where the project writes its own files and reads them back: a local (or shared-filesystem)
directory, or any fsspec URL (``s3://``, ``gs://``, ``memory://``). The data pipeline's runs and
the checkpoints both go through it.

A ``Storage`` is rooted at one directory and takes ``/``-separated names relative to it.

Writes appear whole or not at all (:meth:`Storage.open_write`, :meth:`Storage.write_bytes`). A local
file is written under ``NAME.tmp.PID``, fsync'ed, renamed into place, and its folder fsync'ed so the
rename survives a power loss. Object stores have no rename, but an object becomes visible only when
its upload completes (one PUT, or the completion of a multipart upload), so it is written straight
to its key and a failed write discards the upload. Readers find a pipeline run's output through its
manifest and a checkpoint's files through its meta.json, both written last, never through a
listing. :meth:`Storage.rename` never replaces what is at its destination.

Reads are bounded: whole files only under a size limit (:meth:`Storage.read`), otherwise byte
ranges; each is counted by purpose in ``bytes_read``, so a test can assert that a rank reads only
its share. File names can come from data (meta.json, a manifest): a local read is confined to the
directory (no ``..``, no absolute path, no symlink leading out) and to regular files (a FIFO or a
device put where ``meta.json`` belongs would block its reader for ever).

What it refuses (a location that is not storage, a file that is missing, too large, outside or not
a regular file, a rename onto a taken name) raises the error type it was opened with, in one line
that ends with the owner's advice: ``StorageError`` by default, ``CheckpointError`` for checkpoints.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
import shutil
import stat
from collections import Counter
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from glm_common.durable import fsync_dir, sync_file
from glm_common.errors import GlmError
from glm_common.locations import check_scheme, is_url

CHUNK = 8 << 20  # bytes per read call (a whole file, a large range)


class StorageError(GlmError, ValueError):
    """A location or file that storage refuses; the message says which and what to do."""


class Storage:
    """A directory: ``location`` is a local path or an fsspec URL. ``what`` names its files in
    messages (``"checkpoint"``: "checkpoint file ... is missing"), ``error`` is the type refusals
    raise and ``advice`` ends their message; ``counter`` is shared with the storage this one was
    derived from (:meth:`child`)."""

    def __init__(
        self,
        location: str | Path,
        *,
        what: str = "output",
        error: type[Exception] = StorageError,
        advice: str = "",
        counter: Counter | None = None,
    ) -> None:
        location = str(location)
        self.what, self.error, self.advice = what, error, advice
        try:
            check_scheme(location, f"{what} location")
        except ValueError as err:
            raise error(str(err)) from None
        if is_url(location):
            self.fs, root = fsspec.core.url_to_fs(location, use_listings_cache=False, skip_instance_cache=True)
            self.root = root.rstrip("/") or root
        else:
            self.fs, self.root = LocalFileSystem(), os.path.abspath(location)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.url = self.root if self.local else self.fs.unstrip_protocol(self.root)
        self.bytes_read: Counter = counter if counter is not None else Counter()

    def __reduce__(self):  # a worker process opens its own filesystem (no sockets or locks pickled)
        return functools.partial(Storage, what=self.what, error=self.error, advice=self.advice), (self.url,)

    def __str__(self) -> str:
        return self.url

    def __eq__(self, other) -> bool:
        return isinstance(other, Storage) and self.url == other.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def _like(self, location: str | Path) -> "Storage":
        return Storage(location, what=self.what, error=self.error, advice=self.advice, counter=self.bytes_read)

    def child(self, key: str) -> "Storage":
        """The directory ``key`` below this one (same messages, same byte counter)."""
        return self._like(self.path(key))

    def parent_and_name(self) -> tuple["Storage", str]:
        if self.local:
            return self._like(os.path.dirname(self.root)), os.path.basename(self.root)
        head, _, name = self.url.rpartition("/")
        return self._like(head), name

    def path(self, key: str = "") -> str:
        """The full local path or URL of ``key`` (of this directory when empty)."""
        if not key:
            return self.url
        if self.local:
            return os.path.join(self.root, *key.split("/"))
        return self.fs.unstrip_protocol(posixpath.join(self.root, key))

    def _p(self, key: str) -> str:
        """``key`` as a path of ``self.fs``."""
        return f"{self.root}/{key}" if key else self.root

    def _refuse(self, message: str) -> Exception:
        return self.error(f"{message}; {self.advice}" if self.advice else message)

    # -- queries ----------------------------------------------------------------------------------
    def exists(self, key: str = "") -> bool:
        return os.path.exists(self._p(key)) if self.local else self.fs.exists(self._p(key))

    def isdir(self, key: str = "") -> bool:
        return os.path.isdir(self._p(key)) if self.local else self.fs.isdir(self._p(key))

    def isfile(self, key: str) -> bool:
        """Whether ``key`` is a regular file inside this directory."""
        if not self.local:
            return self.fs.isfile(self._p(key))
        try:
            self._file(key)
        except (OSError, self.error):
            return False
        return True

    def size(self, key: str) -> int:
        """Bytes of the file ``key``: FileNotFoundError if absent, ``self.error`` if it is no
        regular file inside this directory."""
        return os.stat(self._file(key)).st_size if self.local else int(self.fs.size(self._p(key)))

    def listdir(self, key: str = "") -> list[str]:
        """Names directly below ``key`` (none if it does not exist). For bookkeeping (completion
        markers, a run's checkpoints), never for finding what a manifest or meta.json lists."""
        if self.local:
            return sorted(os.listdir(self._p(key))) if os.path.isdir(self._p(key)) else []
        try:
            return sorted(
                posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self._p(key), detail=False, refresh=True)
            )
        except FileNotFoundError:
            return []

    def walk(self, key: str = "") -> list[str]:
        """Every file below ``key``, as names relative to this directory."""
        base = self._p(key)
        if self.local:
            return sorted(str(Path(d, n).relative_to(self.root)) for d, _, names in os.walk(base) for n in names)
        return sorted(p[len(self.root) + 1 :] for p in self.fs.find(base))

    def free_bytes(self) -> int | None:
        """Free space on the local filesystem that holds this directory (None for an object store)."""
        if not self.local:
            return None
        path = Path(self.root)
        while not path.exists() and path != path.parent:
            path = path.parent
        return shutil.disk_usage(path).free

    # -- reads (bounded, counted, confined) -------------------------------------------------------
    def _file(self, key: str) -> str:
        """The local path of ``key``, checked before anything opens it: inside this directory once
        symlinks are resolved, and a regular file."""
        root = os.path.realpath(self.root)
        path = os.path.realpath(self._p(key))
        if os.path.isabs(key) or ".." in key.split("/") or not path.startswith(root + os.sep):
            raise self._refuse(f"{self.what} file name {key!r} leads outside {self.url} (crafted or damaged)")
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise self._refuse(f"{self.what} file {self.url}/{key} is not a regular file ({_kind(mode)})")
        return path

    def _open(self, key: str) -> int:
        """A read-only descriptor of the regular file ``key`` (non-blocking: a file swapped for a
        FIFO after the check cannot hang the open, and is refused by the second check)."""
        fd = os.open(self._file(key), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise self._refuse(f"{self.what} file {self.url}/{key} is not a regular file ({_kind(mode)})")
        return fd

    def read(self, key: str, *, max_bytes: int, purpose: str = "whole") -> bytes:
        """The whole file ``key``, refused past ``max_bytes`` (a marker, an index, meta.json)."""
        try:
            size = self.size(key)
        except FileNotFoundError:
            raise self._refuse(f"{self.what} file {self.url}/{key} is missing") from None
        if size > max_bytes:
            raise self._refuse(
                f"{self.what} file {self.url}/{key} is {size} bytes, more than the {max_bytes} "
                f"allowed for it (corrupt, or not the file expected there)"
            )
        return self.read_range(key, 0, size, purpose=purpose)

    def open(self, key: str) -> IO[bytes]:
        """A binary reader of ``key``, streamed: the caller bounds what it buffers."""
        return os.fdopen(self._open(key), "rb") if self.local else self.fs.open(self._p(key), "rb")

    def read_range(self, key: str, offset: int, length: int, *, purpose: str = "data") -> bytes:
        """``length`` bytes at ``offset`` (short only if the file is)."""
        if self.local:
            fd = self._open(key)
            try:
                parts, done = [], 0
                while done < length:  # a length past the end allocates only what the file holds
                    block = os.pread(fd, min(CHUNK, length - done), offset + done)
                    if not block:
                        break
                    parts.append(block)
                    done += len(block)
                data = b"".join(parts)
            finally:
                os.close(fd)
        else:
            data = self.fs.cat_file(self._p(key), start=offset, end=offset + length) if length else b""
        self.bytes_read[purpose] += len(data)
        return data

    def read_ranges(self, keys: list[str], starts: list[int], ends: list[int], *, purpose: str = "data") -> list[bytes]:
        """Bytes ``[start, end)`` of each key; remote ranges are fetched concurrently."""
        if self.local:
            return [
                self.read_range(key, start, end - start, purpose=purpose) if end > start else b""
                for key, start, end in zip(keys, starts, ends)
            ]
        wanted = [i for i in range(len(keys)) if ends[i] > starts[i]]
        got = (
            self.fs.cat_ranges(
                [self._p(keys[i]) for i in wanted],
                [starts[i] for i in wanted],
                [ends[i] for i in wanted],
                on_error="raise",
            )
            if wanted
            else []
        )
        out = [b""] * len(keys)
        for i, data in zip(wanted, got):
            out[i] = data
            self.bytes_read[purpose] += len(data)
        return out

    def read_into(self, key: str, offset: int, out: memoryview, *, purpose: str = "data") -> int:
        """Fill ``out`` (a writable byte buffer) from ``offset``; returns the bytes read."""
        if self.local:
            fd = self._open(key)
            try:
                done = 0
                while done < len(out):
                    n = os.preadv(fd, [out[done : done + CHUNK]], offset + done)
                    if n <= 0:
                        break
                    done += n
            finally:
                os.close(fd)
        else:
            data = self.fs.cat_file(self._p(key), start=offset, end=offset + len(out)) if len(out) else b""
            done = len(data)
            out[:done] = data
        self.bytes_read[purpose] += done
        return done

    def chunks(self, key: str, offset: int, length: int, *, purpose: str):
        """``read_range`` in pieces of at most ``CHUNK`` bytes (hashing a large file)."""
        for start in range(offset, offset + length, CHUNK):
            yield self.read_range(key, start, min(CHUNK, offset + length - start), purpose=purpose)

    # -- writes -----------------------------------------------------------------------------------
    @contextmanager
    def open_write(self, key: str) -> Iterator["AtomicFile"]:
        """A binary file that appears at ``key`` only if the block completes."""
        f = AtomicFile(self, key)
        try:
            yield f
        except BaseException:
            f.abort()
            raise
        f.commit()

    def write_bytes(self, key: str, data: bytes) -> None:
        """``data`` at ``key``: a crash leaves the old content or the new, never a part."""
        with self.open_write(key) as f:
            f.write(data)

    def makedirs(self, key: str = "") -> None:
        if self.local:
            os.makedirs(self._p(key), exist_ok=True)

    def remove(self, key: str = "") -> None:
        """A file or a directory tree (nothing if absent)."""
        if self.local:
            path = self._p(key)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.remove(path)
        elif self.fs.exists(self._p(key)):
            self.fs.rm(self._p(key), recursive=True)

    def remove_orphans(self) -> list[str]:
        """Delete the ``NAME.tmp.PID`` files that killed writers left (local only: an object store
        never shows an unfinished upload). Only while nothing writes here: a pipeline's manifest
        writers call it just before the manifest. Returns the keys removed."""
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

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, which must not exist: what is already there (another run's
        checkpoint, a copy) is never replaced. Local: one atomic rename (a directory is never
        renamed onto a non-empty one); object stores: copy + delete."""
        taken = self.error(
            f"{self.url}/{dst} already exists and is never replaced (another run writing into "
            f"this folder, or a copy put there); give each run its own folder, or move {dst} away"
        )
        if self.exists(dst):
            raise taken
        if not self.local:
            self.fs.mv(self._p(src), self._p(dst), recursive=True)
            return
        os.makedirs(os.path.dirname(self._p(dst)), exist_ok=True)
        try:
            os.rename(self._p(src), self._p(dst))
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise taken from None
            raise
        fsync_dir(os.path.dirname(self._p(dst)))

    def fsync_tree(self, key: str = "") -> None:
        """fsync every directory under ``key``, so the names a tree holds survive a power loss (its
        files were fsync'ed as they were committed)."""
        if self.local:
            for dirpath, _, _ in os.walk(self._p(key)):
                fsync_dir(dirpath)


class AtomicFile:
    """A binary file that appears at its key on :meth:`commit` and never otherwise (use
    :meth:`Storage.open_write`, or call :meth:`commit` or :meth:`abort` when it streams across calls)."""

    def __init__(self, storage: Storage, key: str) -> None:
        self.path = storage._p(key)
        self.local = storage.local
        if self.local:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.tmp = f"{self.path}.tmp.{os.getpid()}"
            self.f: IO[bytes] = open(self.tmp, "wb")
        else:
            self.f = storage.fs.open(self.path, "wb")

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
        """Drop the file; never raises for the write that failed (close() flushes the buffer again, and on
        a full disk fails again: the temporary file is removed all the same)."""
        if self.local:
            with suppress(OSError):
                self.f.close()
            with suppress(FileNotFoundError):
                os.unlink(self.tmp)
        elif hasattr(self.f, "discard"):
            self.f.discard()  # fsspec's buffered files: drop the buffer, abort a multipart upload
            self.f.closed = True  # and never upload it when garbage-collected


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a plain file")
