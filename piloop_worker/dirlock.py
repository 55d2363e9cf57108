"""One worker per directory: an exclusive `flock` on `<dir>/worker.lock`, held for the worker's whole life.

Two workers on one `--dir` would scan, re-attach, report and remove each other's job dirs. The lock is on the open
file, so the kernel drops it the moment the worker ends, however it ends (a pid file alone can name a pid reused
since). Its descriptor is close-on-exec and closed in any forked child: a child that kept a copy would hold the
lock for as long as it lives, and shims outlive their worker on purpose. The file holds the holder's pid, for the
refusal's message only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from piloop_common.errors import DirInUse
from piloop_worker import clock

LOCK_NAME = "worker.lock"
_PID_WAIT = 1.0  # the holder writes its pid just after it takes the lock: a reader that finds none waits this long


class DirLock:
    """The worker's hold on its directory; released when the process ends (or by `release`)."""

    def __init__(self, workdir: Path, fd: int) -> None:
        self.workdir, self.fd = workdir, fd
        os.register_at_fork(after_in_child=self._close_in_child)

    def _close_in_child(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def hold_dir(workdir: Path, wait: float = 0.0, on_wait: Callable[[Path, int], None] | None = None) -> DirLock:
    """Lock `workdir` (made if missing) for this process; where another holds it, try again for up to `wait`
    seconds (calling `on_wait(dir, holder's pid)` once), then raise `DirInUse` naming the holder's pid."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        end = clock.now() + wait
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pid = _holder(fd)
                if clock.now() >= end:
                    raise DirInUse(
                        f"{workdir} is in use by worker pid {pid or '?'} (one worker per directory)",
                        dir=str(workdir),
                        pid=pid,
                    ) from None
                if on_wait is not None and not told:
                    on_wait(workdir, pid)
                    told = True
                time.sleep(min(0.1, max(0.0, end - clock.now())))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return DirLock(workdir, fd)


def _holder(fd: int) -> int:
    """The pid the lock's holder wrote, 0 where it wrote none within `_PID_WAIT`."""
    end = clock.now() + _PID_WAIT
    while True:
        with contextlib.suppress(OSError, ValueError):
            return int(os.pread(fd, 32, 0).decode().strip())
        if clock.now() >= end:
            return 0
        time.sleep(0.02)
