"""Tasks for the slot supervisor's tests (tests/integration/test_slot_*.py): plain functions, called by name."""

from __future__ import annotations

import os
import subprocess
import sys
import time

HELD: list[bytes] = []


class Flaky(ConnectionError):
    """Raised by `boom`: its classes are its own, then ConnectionError's, then OSError's."""


def noop() -> None:
    return None


def pid() -> int:
    return os.getpid()


def add(a: int, b: int = 0) -> int:
    return a + b


def boom() -> None:
    raise Flaky("no route")


def big(n: int) -> str:
    return "x" * n


def say(text: str) -> str:
    print(text)
    return text


def hang() -> None:
    while True:
        time.sleep(1)


def leave_a_sleeper(path: str) -> int:
    """Start a process that would outlive the task (its own session), and say its pid."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open(path, "w") as f:
        f.write(str(p.pid))
    return p.pid


def close_stdout() -> int:
    sys.stdout.close()
    os.close(1)
    return os.getpid()


def exit_now(code: int) -> None:
    os._exit(code)


def grow(mb: int) -> int:
    HELD.append(b"x" * (mb << 20))
    return os.getpid()


def wait_for_file(path: str, seconds: float = 60.0) -> str:
    """Return once `path` exists (the test's go), or fail after `seconds`."""
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return path
