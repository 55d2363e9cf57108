"""The measuring the benchmarks share: a log line, waits, quantiles, RSS and CPU of groups of processes, stopping them.

`say` logs a line to stderr, `wait_until` polls a condition (reporting every 10 s), `stamp_time` reads the wall time a
job wrote, `quantile` is by the nearest rank. `Drain` and `Latency` are a drain's and a start latency run's figures;
`RssWatch` samples the largest RSS of groups of processes on a thread, `CpuWatch` the CPU seconds of groups (with
what they reaped) and of the machine, `piloop_cpu` piloop workers' CPU by process (the worker, its slot
supervisors, the jobs' processes). `child_pids` reads a process's children from /proc, cheap enough to sample 10 times a
second; `long_lived` is a worker's processes at rest, `stop_procs` ends processes (or their process groups). `ROOT`
is the checkout, `BIN` the interpreter's bin directory (where `rq` and `celery` are).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent


def compile_piloop() -> None:
    """Write piloop's bytecode (`__pycache__`), as `pip install` does for a package it installs: an editable checkout
    run with PYTHONDONTWRITEBYTECODE set never writes it, so each process piloop starts (worker, supervisors,
    server) would compile its modules from source, ~0.1 s of CPU each, which the peers, installed by pip, never
    pay. Only what changed since the last call is compiled."""
    import compileall

    for pkg in ("piloop_common", "piloop_server", "piloop_worker", "bench"):
        compileall.compile_dir(str(ROOT / pkg), quiet=1)


BIN = Path(sys.executable).parent
MiB = 1 << 20


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_until(
    cond: Callable[[], Any], timeout: float, what: str, every: float = 0.05, report: Callable[[], None] | None = None
) -> Any:
    end = time.monotonic() + timeout
    last = time.monotonic()
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        if report and time.monotonic() - last > 10:
            last = time.monotonic()
            report()
        time.sleep(every)
    raise SystemExit(f"bench: timed out after {timeout}s waiting for {what}")


def stamp_time(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest rank: p99 of 200 samples is the second largest."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


@dataclass
class Drain:
    jobs: int
    seconds: float
    not_succeeded: int = 0
    worker_rss_mib: float = 0.0  # the most one worker's long-lived processes held while draining
    server_rss_mib: float = 0.0
    # CPU ms per job: the server, the workers' long-lived processes (with the children they reaped), Redis, and the
    # whole machine (busy time of all CPUs: it includes what the others sharing the box ran meanwhile)
    cpu_ms: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


@dataclass
class Latency:
    samples: list[float] = field(default_factory=list)  # seconds
    worker_rss_mib: float = 0.0  # idle, after the warm-up job

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000

    @property
    def p99_ms(self) -> float:
        return quantile(self.samples, 0.99) * 1000


class RssWatch:
    """The largest RSS (MiB) seen of each group of processes, sampled every 0.1 s on a thread. A group is its
    processes and, where `children`, the children each has when sampled (slot supervisors, a prefork pool)."""

    def __init__(self, groups: dict[str, list[int]], children: bool = True) -> None:
        self.groups = {k: [psutil.Process(p) for p in pids] for k, pids in groups.items()}
        self.children = children
        self.peak = {k: 0.0 for k in groups}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            for k, procs in self.groups.items():
                self.peak[k] = max(self.peak[k], rss_mib(with_children(procs) if self.children else procs))
            if self.stop.wait(0.1):
                return

    def __enter__(self) -> RssWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


class CpuWatch:
    """CPU seconds of groups of processes (with the children each has reaped) and of the machine, start to stop.
    With `reaped`, what that group's processes reaped (the processes its jobs ran in) is also told apart, as `jobs`."""

    def __init__(self, groups: dict[str, list[int]], reaped: str | None = None) -> None:
        self.groups = {k: [psutil.Process(p) for p in pids] for k, pids in groups.items()}
        self.reaped = reaped
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        out = {}
        for k, procs in self.groups.items():
            total = 0.0
            for p in with_children(procs):
                try:
                    t = p.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
                    if k == self.reaped:
                        out["jobs"] = out.get("jobs", 0.0) + t.children_user + t.children_system
                except psutil.Error:
                    pass
            out[k] = total
        if self.reaped is not None:
            out.setdefault("jobs", 0.0)
        m = psutil.cpu_times()
        out["machine"] = m.user + m.system + m.nice + getattr(m, "irq", 0) + getattr(m, "softirq", 0)
        return out

    def per_job_ms(self, n: int) -> dict[str, float]:
        now = self._now()
        return {k: (now[k] - self.start[k]) * 1000 / n for k in now}


def piloop_cpu(worker_pids: Sequence[int]) -> dict[str, float]:
    """CPU seconds of piloop workers' processes by kind, each since its birth: the workers' own (`worker`), their slot
    supervisors' own (`supervisors`), and what the supervisors reaped or still have: the processes the jobs ran in
    and the warm task processes (`jobs`). A supervisor leads a session of its own but stays its worker's child, so it
    is found there."""
    out = dict.fromkeys(("worker", "supervisors", "jobs"), 0.0)
    for pid in worker_pids:
        try:
            worker = psutil.Process(pid)
            t = worker.cpu_times()
            out["worker"] += t.user + t.system
            for sup_pid in child_pids(worker):
                sup = psutil.Process(sup_pid)
                t = sup.cpu_times()
                out["supervisors"] += t.user + t.system
                out["jobs"] += t.children_user + t.children_system
                for job_pid in child_pids(sup):  # a warm task process (piloop_worker/slots/taskproc.py), alive
                    t = psutil.Process(job_pid).cpu_times()
                    out["jobs"] += t.user + t.system
        except psutil.Error:
            continue
    return out


def with_children(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    out = list(procs)
    for p in procs:
        for c in child_pids(p):
            try:
                out.append(psutil.Process(c))
            except psutil.Error:
                pass
    return out


def child_pids(p: psutil.Process) -> list[int]:
    """`p`'s children from `/proc/PID/task/*/children`: psutil's `children()` reads every process's stat in /proc,
    which 10 times a second for three groups took ~12 % of a CPU from the drains it measures."""
    try:
        tids = os.listdir(f"/proc/{p.pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{p.pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN (or the thread ended): ask psutil
            if not os.path.exists(f"/proc/{p.pid}/task/{tid}"):
                continue
            try:
                return [c.pid for c in p.children(recursive=False)]
            except psutil.Error:
                return []
        except OSError:
            continue
    return out


def rss_mib(procs: Sequence[psutil.Process]) -> float:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / MiB


def long_lived(pid: int) -> list[int]:
    """A worker's process and the children it has at rest (its slot supervisors, a prefork pool)."""
    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=False))]
    except psutil.Error:
        return [pid]


def stop_procs(procs: Sequence[subprocess.Popen], group: bool = False) -> None:
    for p in procs:
        if p.poll() is None:
            if group:
                os.killpg(p.pid, signal.SIGTERM)
            else:
                p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            if group:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
            p.wait(10)
