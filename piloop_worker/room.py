"""A worker's room: the memory it can grant its jobs, sent with each claim (claim.lua fits grants in it)."""

from __future__ import annotations

import os

import psutil

from piloop_common.host import cgroupmem

AVAILABLE_ENV = "PILOOP_MEMORY_AVAILABLE_MB"


def available_mb() -> int:
    """The host's available memory (MiB), or what this worker's cgroup limit leaves it where that is less (a
    container's, `piloop_common.host.cgroupmem`); `PILOOP_MEMORY_AVAILABLE_MB` where set (a test that gives the worker a
    room of its choosing, or a limit the worker cannot read)."""
    raw = os.environ.get(AVAILABLE_ENV, "").strip()
    if raw:
        return int(raw)
    return cgroupmem.available_bytes(int(psutil.virtual_memory().available)) // 2**20


class Room:
    """The room is measured while the worker holds no job (available less the reserve) and kept while it holds
    jobs, since their own use, which lowers the available memory, is already counted by their grants; it shrinks
    at once if the host's other processes take memory meanwhile (available + granted less the reserve)."""

    def __init__(self) -> None:
        self.base: int | None = None

    def measure(self, available: int, granted: int, reserve: int, idle: bool) -> int:
        if idle or self.base is None:
            # a worker that starts with jobs re-attached takes what is available now: low, the safe side
            self.base = max(0, available - reserve)
        return max(0, min(self.base, available + granted - reserve))
