"""Sampling a job's process tree: its peak memory and its CPU seconds."""

from __future__ import annotations

import os

import psutil

from piloop_worker.records import UsageRecord

# no pydantic here: the shim host imports this, and every module it holds is copied by each fork of a shim

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Meter:
    """Samples the tree under one process (a subreaper shim: all its descendants); `usage()` is the peak RSS seen and the CPU spent."""

    def __init__(self, pid: int, include_root: bool = True) -> None:
        self.pid, self.include_root = pid, include_root
        self.peak_rss = 0
        self._cpu: dict[tuple[int, float], float] = {}  # (pid, start time) -> last CPU seconds seen
        self.seen: set[tuple[int, float]] = set()

    def processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            kids = root.children(recursive=True)
        except psutil.Error:
            return []
        return [root, *kids] if self.include_root else kids

    def sample(self) -> None:
        """One look at every process of the tree: its CPU so far, and the tree's resident memory for the peak. The
        tree is walked down its children's lists, one stat read a process: psutil's walk reads every process's stat
        on the host (a drain's supervisor spent ~1 ms a sample on a host of ~300 processes)."""
        pids = _tree(self.pid)
        if pids is None:  # the kernel lists no children (CONFIG_PROC_CHILDREN off)
            pids = [p.pid for p in self.processes()]
        elif self.include_root:
            pids.insert(0, self.pid)
        rss = 0
        for pid in pids:
            got = _stat(pid)
            if got is None:
                continue  # ended meanwhile
            key = (pid, got[0])
            self._cpu[key] = got[1]
            self.seen.add(key)
            rss += got[2]
        self.peak_rss = max(self.peak_rss, rss)

    def usage(self, rusage_cpu: float = 0.0, rusage_maxrss: int = 0, without: int | None = None) -> UsageRecord:
        """The usage so far; `rusage_*` from wait4 of the root cover children that ended between samples. With
        `without` (a warm task process, which lives on), that process's samples are replaced by `rusage_cpu`."""
        if without is None:
            cpu = max(sum(self._cpu.values()), rusage_cpu)
        else:
            cpu = sum(v for (pid, _), v in self._cpu.items() if pid != without) + rusage_cpu
        return UsageRecord(max(self.peak_rss, rusage_maxrss), round(cpu, 3))


def _tree(root: int) -> list[int] | None:
    """`root`'s descendants, from each process's threads' `children` lists; None where the kernel has none."""
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = children(pid)
        if kids is None:
            if pid == root:
                return None
            continue  # unreadable now: its children, if any, are listed at the next sample
        found.extend(kids)
        todo.extend(kids)
    return found


def children(pid: int) -> set[int] | None:
    """The children of `pid`'s threads (/proc/PID/task/TID/children), or None where the kernel does not list them."""
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return set()  # gone: it has no child
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.update(int(c) for c in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # a thread that ended meanwhile
            return None  # the kernel does not list children
        except (OSError, ValueError):
            return None
    return found


def _stat(pid: int) -> tuple[float, float, int] | None:
    """A process's start time (clock ticks since boot), CPU seconds and resident bytes, from one read of its stat."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    f = raw.rpartition(b")")[2].split()  # after the command name, which may hold spaces and parentheses
    try:
        return float(f[19]), (int(f[11]) + int(f[12])) / _TICK, int(f[21]) * _PAGE
    except (IndexError, ValueError):
        return None
