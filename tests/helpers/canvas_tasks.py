"""Tasks for the canvas and nested-work tests (chains, groups, children queued from inside a task)."""

from __future__ import annotations

import os
import time

from piloop_common.errors import PiloopError
from piloop_common.tasks import Client, task


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


@task
def nested_add(a, b):
    """Queues add(a, b) from inside itself, through its relay, and returns its result and the child's id."""
    child = add.delay(a, b)
    return {"value": child.get(timeout=60), "child": child.id}


@task
def nested_elsewhere(pool):
    """Tries to queue a child in another pool; the refusal's message."""
    try:
        add.apply_async((1, 2), pool=pool)
    except PiloopError as e:
        return {"error": e.code, "message": e.message}
    return {"error": ""}


@task
def nested_sleeper(seconds):
    """Queues a sleeping child, notes its id on itself (progress), and sleeps."""
    child = sleepy.delay(seconds)
    Client.from_env().api.call("POST", "/v1/relay/progress", {"note": child.id})
    time.sleep(seconds)
    return child.id
