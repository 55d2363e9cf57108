"""Background tasks for tests/integration/test_background.py: the server's rq workers import this module (the
tests put the repo on the daemon's PYTHONPATH). Each leaves its mark as an event, which the tests read by API."""

from __future__ import annotations

import os
import time


def mark(rt, name: str, seconds: float = 0.0) -> None:
    rt.events.add("test.started", "test", name=name, pid=str(os.getpid()))
    time.sleep(seconds)
    rt.events.add("test.done", "test", name=name, pid=str(os.getpid()))


def boom(rt, name: str) -> None:
    rt.events.add("test.attempt", "test", name=name)
    raise ValueError(f"{name} always fails")
