"""Where checkpoints live: a local (or shared-filesystem) directory, or any fsspec URL (``s3://``,
``gs://``, ...).

A ``Storage`` is rooted at one directory and takes paths relative to it. Local directories keep
the strongest guarantees (fsync of files and directories, atomic renames); object stores have no
rename, so a checkpoint there is written in place and published by its commit record (meta.json,
written last) -- see ``train/checkpoint.py``. Every read goes through ``read``/``read_range``,
which bound what is buffered and count the bytes by purpose (``bytes_read``), so a test can
assert that a rank reads only its share.

File names come from meta.json, which is data: a local read is confined to the directory (no
``..``, no absolute path, no symlink leading out) and to regular files (a FIFO or a device named
``meta.json`` would block a reader for ever). A rename never replaces what is at its destination.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from collections import Counter
from pathlib import Path

from glm_common.durable import fsync_dir
from glm_dist.checkpoint.errors import CheckpointError

CHUNK = 8 << 20  # bytes per write call and per read of a whole file


def is_url(location: str) -> bool:
    return "://" in str(location)


class Storage:
    """A directory: ``root`` is a local path or an fsspec URL."""

    def __init__(self, root: str | Path, *, counter: Counter | None = None):
        root = str(root)
        if root.startswith("file://"):
            root = root[len("file://"):]
        self.local = not is_url(root)
        self.url = str(Path(root)) if self.local else root.rstrip("/")
        self.bytes_read: Counter = counter if counter is not None else Counter()
        self.fs = None
        self.path = self.url
        if not self.local:
            import fsspec

            from data_pipeline.remote import check_scheme

            try:
                check_scheme(self.url, "checkpoint location")
            except ValueError as err:
                raise CheckpointError(str(err)) from None
            self.fs, self.path = fsspec.core.url_to_fs(self.url)

    def __str__(self) -> str:
        return self.url

    def __eq__(self, other) -> bool:
        return isinstance(other, Storage) and self.url == other.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def sub(self, name: str) -> "Storage":
        """The directory ``name`` below this one (sharing the byte counter)."""
        return Storage(str(Path(self.url) / name) if self.local else f"{self.url}/{name}", counter=self.bytes_read)

    def parent_and_name(self) -> tuple["Storage", str]:
        if self.local:
            path = Path(self.url)
            return Storage(path.parent, counter=self.bytes_read), path.name
        head, _, name = self.url.rpartition("/")
        return Storage(head, counter=self.bytes_read), name

    def _p(self, rel: str) -> str:
        return f"{self.path}/{rel}" if rel else self.path

    # -- queries ----------------------------------------------------------------------------------
    def exists(self, rel: str = "") -> bool:
        return os.path.exists(self._p(rel)) if self.local else self.fs.exists(self._p(rel))

    def isdir(self, rel: str = "") -> bool:
        return os.path.isdir(self._p(rel)) if self.local else self.fs.isdir(self._p(rel))

    def isfile(self, rel: str) -> bool:
        """Whether ``rel`` is a regular file inside this directory."""
        if not self.local:
            return self.fs.isfile(self._p(rel))
        try:
            self._file(rel)
        except (OSError, CheckpointError):
            return False
        return True

    def size(self, rel: str) -> int:
        """Bytes of the file ``rel``: FileNotFoundError if absent, CheckpointError if it is no
        regular file inside this directory."""
        return os.stat(self._file(rel)).st_size if self.local else int(self.fs.size(self._p(rel)))

    def _file(self, rel: str) -> str:
        """The local path of ``rel``, checked before anything opens it: inside this directory once
        symlinks are resolved, and a regular file."""
        root = os.path.realpath(self.path)
        path = os.path.realpath(self._p(rel))
        if os.path.isabs(rel) or ".." in rel.split("/") or not path.startswith(root + os.sep):
            raise CheckpointError(f"checkpoint file name {rel!r} leads outside {self.url} (a crafted or damaged "
                                  f"checkpoint); use an earlier checkpoint")
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointError(f"checkpoint file {self.url}/{rel} is not a regular file ({_kind(mode)}); use an "
                                  f"earlier checkpoint")
        return path

    def _open(self, rel: str) -> int:
        """A read-only descriptor of the regular file ``rel`` (non-blocking: a file swapped for a
        FIFO after the check cannot hang the open, and is refused by the second check)."""
        fd = os.open(self._file(rel), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise CheckpointError(f"checkpoint file {self.url}/{rel} is not a regular file ({_kind(mode)}); use an "
                                  f"earlier checkpoint")
        return fd

    def listdir(self, rel: str = "") -> list[str]:
        """Names directly below ``rel`` (empty if it does not exist)."""
        if self.local:
            return sorted(os.listdir(self._p(rel))) if os.path.isdir(self._p(rel)) else []
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1]
                          for p in self.fs.ls(self._p(rel), detail=False, refresh=True))
        except FileNotFoundError:
            return []

    def walk(self, rel: str = "") -> list[str]:
        """Every file below ``rel``, as paths relative to this directory."""
        base = self._p(rel)
        if self.local:
            return sorted(str(Path(d, n).relative_to(self.path)) for d, _, names in os.walk(base) for n in names)
        return sorted(p[len(self.path) + 1:] for p in self.fs.find(base))

    # -- reads (bounded, counted) -------------------------------------------------------------------
    def read(self, rel: str, *, max_bytes: int, purpose: str = "state") -> bytes:
        """A whole file of at most ``max_bytes``; longer is a ``CheckpointError``."""
        try:
            size = self.size(rel)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file {self.url}/{rel} is missing; use an earlier checkpoint") from None
        if size > max_bytes:
            raise CheckpointError(f"checkpoint file {self.url}/{rel} is {size} bytes, more than the {max_bytes} "
                                  f"allowed for it (corrupt or not a checkpoint file); use an earlier checkpoint")
        return self.read_range(rel, 0, size, purpose=purpose)

    def read_range(self, rel: str, offset: int, length: int, *, purpose: str = "data") -> bytes:
        """``length`` bytes at ``offset`` (short only if the file is)."""
        if self.local:
            fd = self._open(rel)
            try:
                parts, done = [], 0
                while done < length:
                    block = os.pread(fd, min(CHUNK, length - done), offset + done)
                    if not block:
                        break
                    parts.append(block)
                    done += len(block)
                data = b"".join(parts)
            finally:
                os.close(fd)
        else:
            data = self.fs.cat_file(self._p(rel), start=offset, end=offset + length) if length else b""
        self.bytes_read[purpose] += len(data)
        return data

    def read_into(self, rel: str, offset: int, out: memoryview, *, purpose: str = "data") -> int:
        """Fill ``out`` (a writable byte buffer) from ``offset``; returns the bytes read."""
        if self.local:
            fd = self._open(rel)
            try:
                done = 0
                while done < len(out):
                    n = os.preadv(fd, [out[done:done + CHUNK]], offset + done)
                    if n <= 0:
                        break
                    done += n
            finally:
                os.close(fd)
        else:
            data = self.fs.cat_file(self._p(rel), start=offset, end=offset + len(out)) if len(out) else b""
            done = len(data)
            out[:done] = data
        self.bytes_read[purpose] += done
        return done

    def chunks(self, rel: str, offset: int, length: int, *, purpose: str):
        """``read_range`` in pieces of at most ``CHUNK`` bytes (hashing a large file)."""
        for start in range(offset, offset + length, CHUNK):
            yield self.read_range(rel, start, min(CHUNK, offset + length - start), purpose=purpose)

    # -- writes -------------------------------------------------------------------------------------
    def open_write(self, rel: str):
        """A binary file for writing (parents made); local files are fsync'ed by ``close_write``."""
        if self.local:
            os.makedirs(os.path.dirname(self._p(rel)), exist_ok=True)
            return open(self._p(rel), "wb")
        return self.fs.open(self._p(rel), "wb")

    def close_write(self, f) -> None:
        if self.local:
            f.flush()
            os.fsync(f.fileno())
        f.close()

    def write_bytes(self, rel: str, data: bytes) -> None:
        f = self.open_write(rel)
        try:
            f.write(data)
        finally:
            self.close_write(f)

    def write_atomic(self, rel: str, data: bytes) -> None:
        """A crash leaves the old content or the new, never a part (object stores: one PUT)."""
        if not self.local:
            self.write_bytes(rel, data)
            return
        tmp = rel + ".tmp"
        self.write_bytes(tmp, data)
        os.replace(self._p(tmp), self._p(rel))
        fsync_dir(os.path.dirname(self._p(rel)))

    def makedirs(self, rel: str = "") -> None:
        if self.local:
            os.makedirs(self._p(rel), exist_ok=True)

    def remove(self, rel: str = "") -> None:
        """A file or a directory tree (nothing if absent)."""
        if self.local:
            path = self._p(rel)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.remove(path)
        elif self.fs.exists(self._p(rel)):
            self.fs.rm(self._p(rel), recursive=True)

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, which must not exist: a checkpoint already there (another run's,
        or a copy) is never replaced. Local: one atomic rename (a directory is never renamed onto a
        non-empty one); object stores: copy + delete."""
        taken = CheckpointError(f"{self.url}/{dst} already exists and is never replaced (another run writing into "
                                f"this folder, or a copy put there); give each run its own train.out_dir, or move "
                                f"{dst} away")
        if self.exists(dst):
            raise taken
        if not self.local:
            self.fs.mv(self._p(src), self._p(dst), recursive=True)
            return
        os.makedirs(os.path.dirname(self._p(dst)) or ".", exist_ok=True)
        try:
            os.rename(self._p(src), self._p(dst))
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise taken from None
            raise
        fsync_dir(os.path.dirname(self._p(dst)) or ".")

    def fsync_tree(self, rel: str = "") -> None:
        """fsync every directory under ``rel`` (files are fsync'ed as they are closed)."""
        if self.local:
            for dirpath, _, _ in os.walk(self._p(rel)):
                fsync_dir(dirpath)

    def free_bytes(self) -> int | None:
        if not self.local:
            return None
        path = Path(self.path)
        while not path.exists() and path != path.parent:
            path = path.parent
        return shutil.disk_usage(path).free


def _kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    return next((name for test, name in kinds if test(mode)), "not a plain file")
