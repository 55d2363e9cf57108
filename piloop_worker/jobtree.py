"""The job's process tree, as its shim (a subreaper) sees it: signalled, killed and reaped whole, the processes that
left the job's group (setsid, setpgid) included."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

from piloop_worker import clock
from piloop_worker.cgroups import JobCgroup
from piloop_worker.usage import Meter, children


def kill_now(pid: int, meter: Meter, cg: JobCgroup | None) -> None:
    """SIGKILL to the whole tree, and to whatever of the job is left in its cgroup."""
    signal_tree(pid, meter, signal.SIGKILL)
    if cg is not None:
        cg.kill_all()


def _has_children() -> bool:
    """Whether the shim has a child left, without reaping it. A subreaper with no child has no descendant at all
    (an orphan is re-parented to it), so this spares the walk over all of /proc when the job left nothing."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _others(keep: int) -> bool:
    """Whether the shim has a descendant other than `keep`, its child: with none but `keep`, and `keep` with no child,
    there is none (an orphan comes to the shim, a subreaper). Two reads of /proc, not psutil's walk of all of it."""
    mine = children(os.getpid())
    return mine is None or mine != {keep} or children(keep) != set()


def signal_tree(pgid: int, meter: Meter, sig: int) -> None:
    """Signal the job's process group, and every descendant that left it (setsid, setpgid)."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)
    if not _has_children():
        return
    for p in meter.processes():
        with contextlib.suppress(OSError):
            os.kill(p.pid, sig)


def reap_all(pgid: int, timeout: float, keep: int = 0) -> None:
    """Kill and reap every process left under the shim, until it has no child (or `timeout`); with `keep` (a warm
    task process, `warm.py`), every one but that one, whose group is then its own alone."""
    end = clock.now() + timeout
    while clock.now() < end and (_others(keep) if keep else _has_children()):
        if not keep:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
        for p in psutil.Process().children(recursive=True):
            if p.pid != keep:
                with contextlib.suppress(psutil.Error, OSError):
                    p.kill()
        while True:
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not done:
                break
        time.sleep(0.01)
