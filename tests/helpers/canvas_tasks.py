"""Tasks for the canvas tests (chains, groups, jobs that wait on others)."""

from __future__ import annotations

import os
import time

from piloop_common.tasks import task


@task
def add(a, b):
    return a + b


@task
def double(x):
    return 2 * x


@task(serializer="pickle")
def as_set(x):
    return {x}  # only pickle keeps a set: a chain passes it on as it is


@task
def square(x):
    return x * x


@task
def fail(message):
    raise ValueError(message)


@task
def marker(path):
    """Leaves a file at `path`: a link that must never run finds it absent."""
    with open(path, "w") as f:
        f.write(os.environ.get("PILOOP_JOB", ""))
    return path


@task
def sleepy(seconds):
    time.sleep(seconds)
    return seconds
