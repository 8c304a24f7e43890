"""One writer per output folder: ``glm train`` (``train.out_dir``), ``glm data run`` (``output``),
``glm data tokenize`` (``data.shards_dir``) and ``glm data index`` (DIR) hold ``DIR/.glm.lock`` while
they write.

The lock file is created with ``O_CREAT | O_EXCL``, which is atomic on local disks and on shared
filesystems (NFS v3+, Lustre, GPFS) alike -- ``flock`` is not honoured by every one of them. It holds
the holder's host, pid, the pid's start time and when it started. It is removed when its holder ends:
normally, on an error, on Ctrl-C, on SIGTERM/SIGHUP (unless a handler of the run's own takes those,
as training's stop signals do: that run then ends through its normal path). A ``kill -9`` or a crash
of the node leaves it behind: a later run on the same host sees that the pid is gone (or belongs to
another process, or the host restarted) and takes it over, saying so. A lock from another host cannot
be checked from here: the message says which file to delete if that run is over.

Only local (or shared-filesystem) folders are locked; object stores have no exclusive create.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from glm_common.errors import GlmError

LOCK_NAME = ".glm.lock"
MAX_LOCK_BYTES = 4096
CONTENT_WAIT_S = 2.0  # a lock file just created is written at once; an empty one older than this is broken
GUARD_STALE_S = 30.0  # a takeover guard this old was left by a process killed mid-takeover
ATTEMPTS = 5


class FolderLocked(GlmError):
    """Another process writes the folder (or may: its lock cannot be checked)."""


def is_remote(folder: str) -> bool:
    return "::" in folder or ("://" in folder and not folder.startswith("file://"))


class OutputLock:
    """A held lock; :meth:`release` (idempotent) removes the file if it is still this holder's."""

    def __init__(self, path: Path, token: str, *, created_folder: bool):
        self.path, self.token, self.created_folder = path, token, created_folder
        self.released = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        holder = _read(self.path)
        if holder is not None and holder.get("token") == self.token:
            self.path.unlink(missing_ok=True)
        if self.created_folder:  # a run that failed before writing anything leaves no empty folder
            try:
                self.path.parent.rmdir()
            except OSError:
                pass


def acquire(folder: str | Path, *, command: str, key: str, announce: Callable[[str], None] | None = None) -> OutputLock:
    """Lock ``folder`` (created if missing) for ``command`` (e.g. ``"glm train"``); ``key`` names the
    setting that chose the folder, for the messages. A stale lock is taken over, with a line to
    ``announce`` (stderr by default); a live one, or one that cannot be checked, raises
    :class:`FolderLocked` with what to do."""
    announce = announce or (lambda line: print(line, file=sys.stderr, flush=True))
    folder = Path(str(folder).removeprefix("file://"))
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FolderLocked(f"cannot create {key} {folder}: {err.strerror or err}") from None
    path = folder / LOCK_NAME
    for _ in range(ATTEMPTS):
        token = secrets.token_hex(8)
        if _create(path, _identity(command, token)):
            return OutputLock(path, token, created_folder=created)
        holder = _wait_for_content(path)
        if holder is None and not path.exists():
            continue  # released meanwhile
        if holder is None:
            raise FolderLocked(
                f"{key} {folder} has a lock file {path} that is empty or unreadable; if no glm "
                f"command writes there, delete it and rerun"
            )
        reason = stale_reason(holder)
        if reason is None:
            raise FolderLocked(_refusal(holder, folder=folder, key=key, path=path))
        if _take_over(path, holder):
            announce(f"{command}: taking over the lock of {key} {folder}: it was left by {_who(holder)}, {reason}")
    raise FolderLocked(
        f"{key} {folder}: could not take {path} in {ATTEMPTS} attempts (other processes keep "
        f"taking it); is another glm command starting on the same folder?"
    )


@contextmanager
def held(lock: OutputLock | None) -> Iterator[OutputLock | None]:
    """Release ``lock`` when the block ends, and also on SIGTERM/SIGHUP where nothing else handles
    them (the process then dies of the signal as before)."""
    if lock is None:
        yield None
        return
    restore = _release_on_signals(lock)
    try:
        yield lock
    finally:
        restore()
        lock.release()


@contextmanager
def output_lock(folder: str, *, command: str, key: str) -> Iterator[OutputLock | None]:
    """:func:`acquire` and :func:`held` together, for one process; no lock for an object store."""
    with held(None if is_remote(folder) else acquire(folder, command=command, key=key)) as lock:
        yield lock


def stale_reason(holder: dict) -> str | None:
    """Why a lock file's holder is certainly gone (None when it may be alive)."""
    if holder.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if boot and holder.get("boot_id") and holder["boot_id"] != boot:
        return "and this host has restarted since"
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return "which names no process"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "which is no longer running"
    except PermissionError:
        pass  # alive, another user's
    state, start = _proc_stat(pid)
    if state in ("Z", "X"):  # a killed process nobody has reaped yet (its parent died first)
        return "which is no longer running"
    if start is not None and holder.get("pid_start") is not None and start != holder["pid_start"]:
        return "whose pid now belongs to another process"
    return None


def _identity(command: str, token: str) -> dict:
    return {
        "command": command,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": _proc_stat(os.getpid())[1],
        "boot_id": _boot_id(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "token": token,
    }


def _create(path: Path, content: dict) -> bool:
    """Create ``path`` holding ``content`` if no file is there (atomically); whether it did."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps(content).encode())  # one small write: readers see it whole or empty
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _read(path: Path) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_LOCK_BYTES)
    finally:
        os.close(fd)
    try:
        holder = json.loads(data)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _wait_for_content(path: Path) -> dict | None:
    """The holder in ``path``; a file created this instant may not be written yet."""
    deadline = time.monotonic() + CONTENT_WAIT_S
    while (holder := _read(path)) is None and path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return holder


def _take_over(path: Path, holder: dict) -> bool:
    """Remove a stale lock file if it is still ``holder``'s. Takeovers are serialised by a guard file,
    so two processes that both found the same stale lock cannot remove each other's new one."""
    guard = path.with_name(path.name + ".takeover")
    if not _create(guard, {"pid": os.getpid(), "host": socket.gethostname()}):
        try:
            if time.time() - guard.stat().st_mtime > GUARD_STALE_S:
                guard.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        time.sleep(0.05)
        return False
    try:
        current = _read(path)
        if current is not None and current.get("token") == holder.get("token"):
            path.unlink(missing_ok=True)
            return True
        return False
    finally:
        guard.unlink(missing_ok=True)


def _who(holder: dict) -> str:
    host = holder.get("host", "?")
    here = "this host" if host == socket.gethostname() else f"host {host}"
    return (
        f"{holder.get('command', 'a glm command')} (pid {holder.get('pid', '?')} on {here}, started "
        f"{holder.get('started', '?')})"
    )


def _refusal(holder: dict, *, folder: Path, key: str, path: Path) -> str:
    if holder.get("host") == socket.gethostname():
        return (
            f"{key} {folder} is in use by {_who(holder)}; one writer per folder: wait for it to end, or "
            f"choose another {key}"
        )
    return (
        f"{key} {folder} is locked by {_who(holder)}, which cannot be checked from {socket.gethostname()}; "
        f"if that run is over, delete {path} and rerun, or choose another {key}"
    )


def _proc_stat(pid: int) -> tuple[str | None, int | None]:
    """The pid's state letter and start time in clock ticks since boot (Linux; else None, None): the
    start time tells a reused pid from its first owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None, None
    fields = stat[stat.rfind(")") + 2 :].split()  # fields 3.. of proc(5): state is 3, starttime 22
    start = int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None
    return (fields[0] if fields else None), start


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _release_on_signals(lock: OutputLock) -> Callable[[], None]:
    """Handlers for SIGTERM/SIGHUP (those left at their default) that release ``lock`` and then die of
    the signal as before; returns what restores the defaults."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        lock.release()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    mine = []
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, handler)
            mine.append(sig)

    def restore() -> None:
        for sig in mine:
            if signal.getsignal(sig) is handler:
                signal.signal(sig, signal.SIG_DFL)

    return restore
