"""Sampling a job's process tree with psutil: its peak memory and its CPU seconds."""

from __future__ import annotations

import psutil

from piloop_worker.records import UsageRecord

# no pydantic here: the shim host imports this, and every module it holds is copied by each fork of a shim


class Meter:
    """Samples the tree under one process (a subreaper shim: all its descendants); `usage()` is the peak RSS seen and the CPU spent."""

    def __init__(self, pid: int, include_root: bool = True) -> None:
        self.pid, self.include_root = pid, include_root
        self.peak_rss = 0
        self._cpu: dict[tuple[int, float], float] = {}  # (pid, create_time) -> last CPU seconds seen
        self.seen: set[tuple[int, float]] = set()

    def processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            kids = root.children(recursive=True)
        except psutil.Error:
            return []
        return [root, *kids] if self.include_root else kids

    def sample(self) -> None:
        rss = 0
        for p in self.processes():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    self._cpu[key] = t.user + t.system
                    self.seen.add(key)
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def usage(self, rusage_cpu: float = 0.0, rusage_maxrss: int = 0, without: int | None = None) -> UsageRecord:
        """The usage so far; `rusage_*` from wait4 of the root cover children that ended between samples. With
        `without` (a warm task process, which lives on), that process's samples are replaced by `rusage_cpu`."""
        if without is None:
            cpu = max(sum(self._cpu.values()), rusage_cpu)
        else:
            cpu = sum(v for (pid, _), v in self._cpu.items() if pid != without) + rusage_cpu
        return UsageRecord(max(self.peak_rss, rusage_maxrss), round(cpu, 3))
