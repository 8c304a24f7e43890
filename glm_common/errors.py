"""The project's error for a user's mistake or a bad input: the ``glm`` command prints its message
as one line (what was wrong, where, what to do) and exits with code 2, never a traceback."""


class GlmError(Exception):
    """Base of every error whose message is written for the user."""
