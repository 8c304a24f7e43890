"""The error for a checkpoint that cannot be used, raised by the format and by the storage that
holds it: :func:`checkpoint_storage` opens a folder or URL so that what the storage refuses (a
missing or oversized file, a name leading out of the folder, a FIFO) is a ``CheckpointError``."""

from __future__ import annotations

from pathlib import Path

from glm_common.storage import Storage
from glm_dist.errors import GlmError


class CheckpointError(GlmError, RuntimeError):
    """A checkpoint that cannot be used; the message says which file and what to do."""


def checkpoint_storage(location: str | Path | Storage) -> Storage:
    """``location`` (a folder, an fsspec URL, or a ``Storage`` opened here already) as the storage of
    checkpoints: its refusals are ``CheckpointError``s that end in what to do."""
    if isinstance(location, Storage):
        return location
    return Storage(location, what="checkpoint", error=CheckpointError, advice="use an earlier checkpoint")
