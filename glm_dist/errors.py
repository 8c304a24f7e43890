"""The project's error for a user's mistake or a bad input: the ``glm`` command prints its message
as one line (what was wrong, where, what to do) and exits with code 2, never a traceback. Defined in
``glm_common.errors`` (the data pipeline raises it too, without importing ``glm_dist``)."""

from glm_common.errors import GlmError

__all__ = ["GlmError"]
