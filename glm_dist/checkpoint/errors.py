"""The error for a checkpoint that cannot be used, raised by the format and by its storage."""
from __future__ import annotations

from glm_dist.errors import GlmError


class CheckpointError(GlmError, RuntimeError):
    """A checkpoint that cannot be used; the message says which file and what to do."""
