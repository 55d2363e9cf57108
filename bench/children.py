"""Every process a bench run starts ends with the run, however it ends: SIGTERM ends it through its cleanup as
SIGINT does (a `finally` stops each daemon, worker and peer it started), and whatever is left after that (a part
that failed before its cleanup, a worker's slot supervisors reparented to init) is found by a mark in its
environment, which every child inherits, and killed."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import psutil

RUN_ENV = "BENCH_RUN_MARK"  # not PILOOP_*: a worker keeps those from its jobs


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def ending_with_the_run() -> Iterator[str]:
    """The run's mark; on leaving, every process that carries it is killed (SIGTERM, then SIGKILL after 3 s)."""
    mark = uuid.uuid4().hex
    os.environ[RUN_ENV] = mark
    before = signal.signal(signal.SIGTERM, _stop)
    try:
        yield mark
    finally:
        signal.signal(signal.SIGTERM, before)
        left = marked(mark)
        if left:
            print(f"bench: ending {len(left)} process(es) the run left behind", file=sys.stderr)
            for p in left:
                _quietly(p.terminate)
            _, alive = psutil.wait_procs(left, timeout=3)
            for p in alive:
                _quietly(p.kill)
        del os.environ[RUN_ENV]


def marked(mark: str) -> list[psutil.Process]:
    """This user's processes, other than this one, whose environment carries `mark`."""
    out = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get(RUN_ENV) == mark:
                out.append(p)
        except (psutil.Error, OSError):  # gone, or another user's
            continue
    return out


def _quietly(act: object) -> None:
    try:
        act()  # type: ignore[operator]
    except psutil.Error:
        pass
