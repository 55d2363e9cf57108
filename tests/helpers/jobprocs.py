"""A running job's processes, found the way an operator would find them, whatever supervises the job.

Nothing here reads a worker's files: a job is found by what it writes itself (the marker job's lines with its pid
and process group, a job that writes `$$` to a file under the test's tmp dir, a task that returns its pid), its
**supervisor** is that process's parent (a process job's first process, or the warm process a task runs in, is a
child of whatever supervises it), and the worker is the test's own handle on it (`RemoteWorker.proc`)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
from pathlib import Path

import psutil

from tests.helpers.redis import wait_for
from tests.helpers.workers import marker_runs, pgid_alive


def parent_of(pid: int) -> int:
    """The parent pid of `pid` from `/proc/<pid>/stat` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def supervisor_of(pid: int) -> int:
    """The process that supervises the job whose first process (a process job's leader, a task's warm process) is
    `pid`: its parent. Fails if the job is gone or was left to init."""
    parent = parent_of(pid)
    assert parent > 1 and running(parent), f"process {pid} has no live supervisor (its parent is {parent})"
    return parent


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (its children, theirs, ...)."""
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal one process; one already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def started(marker: Path, job: str, timeout: float = 20, runs: int = 1) -> dict:
    """The marker job's `runs`-th run (`tests.helpers.workers.MARKER_JOB`) once it has written its first line."""
    return wait_for(
        lambda: len(r := marker_runs(marker).get(job, [])) >= runs and r[runs - 1],
        timeout,
        interval=0.05,
        what=f"run {runs} of job {job} to start",
    )


def gone_within(pgid: int, seconds: float, what: str) -> float:
    """Wait until no process of the group `pgid` is left (`seconds` stretched by the slowdown); the seconds it took."""
    t0 = time.monotonic()
    wait_for(lambda: not pgid_alive(pgid), seconds, interval=0.02, what=what)
    return time.monotonic() - t0


def pid_job_argv(pid_file: Path, script: str) -> list[str]:
    """A process job that writes its pid (`$$`, its process group's leader) to `pid_file`, then runs `script` in the
    same shell: the test finds it, and its supervisor, without reading anything of the worker's."""
    return [
        "sh",
        "-c",
        f"echo $$ > {shlex.quote(str(pid_file))}.tmp && mv {shlex.quote(str(pid_file))}.tmp "
        f"{shlex.quote(str(pid_file))}; {script}",
    ]


def pid_in(pid_file: Path, timeout: float = 30) -> int:
    """The pid a job wrote to `pid_file` (`pid_job_argv`), once it is there."""
    return wait_for(
        lambda: pid_file.exists() and int(pid_file.read_text().strip() or 0),
        timeout,
        interval=0.05,
        what=f"a pid in {pid_file}",
    )
