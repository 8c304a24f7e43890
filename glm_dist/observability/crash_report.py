"""The full traceback of an unexpected error, in a private file: the ``glm`` command prints one
line and the file's path.

Where: ``GLM_CRASH_DIR`` if set, else the run's own folder (``<train.out_dir>/crashes``) when the
command has one, else a per-user folder under the temporary directory. A folder is created 0700; a
shared temporary directory's folder is used only if it is a real directory (no link) of this user
that nobody else can enter, else a fresh ``mkdtemp`` one is. The file is created with ``O_EXCL |
O_NOFOLLOW`` and mode 0600 under an unpredictable name, so a link planted at a guessed name can never
redirect the write. A folder that cannot be written falls back to the next; the line says so.
Credentials in the traceback (URLs, tokens) are redacted.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
import time
import traceback
from pathlib import Path

from glm_dist.observability.redact import redact_text

CRASH_DIR_ENV = "GLM_CRASH_DIR"


def write_crash_report(command: str, err: BaseException, *, run_dir: str | None = None) -> str:
    """Write ``err``'s traceback; return where it went, as the end of the one-line summary
    (``"full traceback in PATH"``, and why an earlier folder was passed over), never raising."""
    text = redact_text("".join(traceback.format_exception(err)))
    name = f"glm-{command.replace(' ', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(4)}.log"
    chosen = os.environ.get(CRASH_DIR_ENV)
    candidates = [(f"{CRASH_DIR_ENV} {chosen}", lambda: _own_folder(Path(chosen)))] if chosen else []
    if run_dir and not chosen:
        candidates.append((f"{run_dir}/crashes", lambda: _own_folder(Path(run_dir, "crashes"))))
    candidates += [("the per-user crash folder", _user_folder), ("a new temporary folder", _fresh_folder)]
    passed = []
    for label, folder in candidates:
        try:
            path = folder() / name
            _write_private(path, text)
        except Exception as exc:  # noqa: BLE001 -- any failure here only moves the report on
            passed.append(f"{label}: {getattr(exc, 'strerror', None) or exc}")
            continue
        return f"full traceback in {path}" + (f" (not written to {'; '.join(passed)})" if passed else "")
    return f"the traceback could not be saved ({'; '.join(passed)})"


def _own_folder(folder: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def _user_folder() -> Path:
    """``$TMPDIR/glm-crash-UID``, if it is this user's private directory (not a planted one)."""
    folder = Path(tempfile.gettempdir(), f"glm-crash-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} is not a private directory of this user")
    return folder


def _fresh_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="glm-crash-"))


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
