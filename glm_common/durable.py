"""Durable publication of files: what a crash (power loss, kill -9, a full disk) can leave behind.

A file is written under a temporary name, flushed and fsync'ed, renamed into place, and then its
directory is fsync'ed so the rename itself survives. Object stores have no rename and no fsync: an
object appears whole when its upload completes, so there these steps are skipped.
"""

from __future__ import annotations

import os


def is_local(fs) -> bool:
    """Whether an fsspec filesystem is the local one (fsync and atomic rename exist)."""
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def sync_file(f) -> None:
    """Flush ``f`` (a local file or fsspec's local file wrapper) to the disk."""
    f.flush()
    os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(fs, tmp: str, path: str) -> None:
    """Rename the complete ``tmp`` to ``path`` on ``fs``; locally also fsync the directory."""
    fs.mv(tmp, path)
    if is_local(fs):
        fsync_dir(os.path.dirname(path))
