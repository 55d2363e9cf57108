"""A timer on CLOCK_BOOTTIME that a selector can watch: Linux's timerfd, armed at an absolute `clock.now()` time.

A selector's own timeout runs on CLOCK_MONOTONIC, which stops while the machine is suspended: a supervisor asleep
until a job's deadline would wake after a suspend as late as the suspend was long, its job running on meanwhile
beside the copy the server handed on. A timerfd on CLOCK_BOOTTIME fires when the deadline passes, a suspend counted,
so the supervisor wakes past it at once and kills without grace (`job.LATE`). Python has `os.timerfd_create` only
from 3.13: this calls libc. Where it cannot (`BootTimer.open()` gives None) the supervisor wakes every `POLL`.
"""

from __future__ import annotations

import ctypes
import math
import os
from typing import Any

CLOCK_BOOTTIME = 7
TFD_CLOEXEC, TFD_NONBLOCK, TFD_TIMER_ABSTIME = 0o2000000, 0o4000, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class BootTimer:
    """One timerfd; `arm(at)` sets it (a system call only when `at` changed), `drain()` after it fired."""

    def __init__(self, fd: int, settime: Any) -> None:
        self.fd = fd
        self._settime = settime
        self._armed: float | None = None

    @classmethod
    def open(cls) -> BootTimer | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create, settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):
            return None
        create.argtypes = [ctypes.c_int, ctypes.c_int]
        settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        fd = create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK)
        if fd < 0:
            return None
        return cls(fd, settime)

    def fileno(self) -> int:
        return self.fd

    def arm(self, at: float) -> None:
        """Fire at `at` (`clock.now()` seconds; at once when it has passed)."""
        if at == self._armed:
            return
        frac, whole = math.modf(at)
        nsec = int(frac * 1e9) if whole > 0 else max(int(frac * 1e9), 1)  # an it_value of 0 would disarm it
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(max(int(whole), 0), nsec))
        if self._settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._armed = at

    def drain(self) -> None:
        """Read the expirations, so the descriptor polls quiet until it fires again."""
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            pass
        self._armed = None

    def close(self) -> None:
        os.close(self.fd)


__all__ = ["BootTimer"]
