"""The project's error for a user's mistake or a bad input: the ``glm`` command prints its message
as one line (what was wrong, where, what to do) and exits with code 2, never a traceback."""

import errno

FULL = (errno.ENOSPC, errno.EDQUOT)


class GlmError(Exception):
    """Base of every error whose message is written for the user."""


def disk_full(err: BaseException) -> bool:
    """A write refused because its disk or the user's quota is full -- the machine's state, not a bug:
    an ``OSError`` with ENOSPC/EDQUOT, or a Rust library's error that quotes it (safetensors writes
    "I/O error: No space left on device (os error 28)")."""
    if isinstance(err, OSError):
        return err.errno in FULL
    return any(f"(os error {code})" in str(err) for code in FULL)
