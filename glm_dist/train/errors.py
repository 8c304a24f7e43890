"""Errors that end a training run with a message instead of a traceback."""

from glm_dist.errors import GlmError


class TrainingDiverged(RuntimeError):
    """Too many steps with a non-finite loss."""


class Preempted(RuntimeError):
    """A stop signal arrived; a checkpoint was written. Exit code 75 asks the launcher to requeue."""

    exit_code = 75  # EX_TEMPFAIL


class CollectiveTimeout(GlmError, RuntimeError):
    """A collective that some rank never joined (hung or dead); the message names the ranks."""


class PeerGone(GlmError, RuntimeError):
    """Another rank's process ended mid-collective: its own log says why; not a bug of this rank."""
