"""`$PILOOP_HOME/piloop.pid`: the daemon's pid, and a lock it holds for its whole life.

The lock, not the pid, says whether a daemon runs on a home: the kernel drops it when the daemon ends however it
ends (a SIGKILL, the OOM killer), so a file left behind never blocks the next `piloop serve`, and a reused pid
never passes for a daemon. The daemon's children never hold it (its descriptor closes on exec).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

PID_FILE = "piloop.pid"


class HomeTaken(Exception):
    """Another daemon holds this home's lock; `pid` is what its file says (0: not written yet)."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.pid = pid


def hold(home: Path) -> int:
    """Take the home's lock for this process and write its pid; the descriptor, kept open until `release`.
    HomeTaken when a live daemon holds it."""
    fd = os.open(home / PID_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for attempt in range(5):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == 4:
                pid = _read(fd)
                os.close(fd)
                raise HomeTaken(pid) from None
            time.sleep(0.01)  # a `holder` looking this very moment lets go at once
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def release(home: Path, fd: int) -> None:
    """The file removed while the lock is still held (no other daemon can have written it), then the lock let go."""
    with contextlib.suppress(FileNotFoundError):
        (home / PID_FILE).unlink()
    os.close(fd)


def holder(home: Path) -> int | None:
    """The pid of the daemon that holds the home's lock (0 when it has not written it yet), or None when none does."""
    try:
        fd = os.open(home / PID_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(fd)
        return None  # a file nobody holds: left by a daemon that is gone
    finally:
        os.close(fd)


def _read(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0)
    except (OSError, ValueError):
        return 0
