"""The data package's error for a run that cannot start or continue."""

from __future__ import annotations


class PipelineError(RuntimeError):
    """A run that cannot start or continue (the message says what to fix)."""
