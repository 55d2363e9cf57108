"""Tasks for the tests: a module the worker can import (the tests put the repo on its PYTHONPATH)."""

from __future__ import annotations

import os

from piloop_common.tasks import task

IMPORTED_BY = os.getpid()  # the process that imported this module: the shim host, when it preloads it


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
