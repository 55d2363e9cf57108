"""Tasks for the tests: a module the worker can import (the tests put the repo on its PYTHONPATH)."""

from __future__ import annotations

import os

from piloop_common.tasks import task

IMPORTED_BY = os.getpid()  # the process that imported this module: the supervisor, when it preloads it


@task
def add(a, b):
    return a + b


@task(serializer="pickle")
def pair(x):
    return (x, {x})  # a tuple and a set: only pickle keeps them


@task
def boom(message):
    raise ValueError(message)


@task
def whoami():
    """Where the task runs: its pid, its parent, who imported this module, and its command line."""
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [a.decode() for a in f.read().split(b"\0") if a]
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "imported_by": IMPORTED_BY,
        "cmdline": cmdline,
        "cwd": os.getcwd(),
        "job": os.environ.get("PILOOP_JOB", ""),
    }


@task
def chatty(n):
    for i in range(n):
        print("step", i)
    return n


@task
def text(n):
    """A result of about `n` bytes."""
    return "x" * n


class Flaky(OSError):
    """A subclass of a class a task's retry_on names: it is retried as its base is."""


def _attempt(marker: str) -> int:
    """This attempt's number (from 1), counted in a file the test names."""
    with open(marker, "a+") as f:
        f.write(".")
        f.seek(0)
        return len(f.read())


@task(retries=2, retry_backoff=1, retry_on=(OSError,))
def flaky(marker, fails, kind="flaky"):
    """Raises (a Flaky, or a ValueError with kind="value") on its first `fails` attempts, then returns the attempt."""
    n = _attempt(marker)
    if n <= fails:
        raise (Flaky if kind == "flaky" else ValueError)(f"attempt {n} fails")
    return n


@task
def sleepy(seconds):
    import time

    time.sleep(seconds)
    return seconds
