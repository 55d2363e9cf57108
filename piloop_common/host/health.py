"""A worker's word on its own health: `<dir>/health.json`, written after each heartbeat its server acknowledged, and
read by `piloop worker check` (a container's health check, which must not probe the server: a worker is healthy when
it reaches its server, and only it knows whether it does).

Healthy means: the worker's process is alive and its last acknowledged heartbeat is younger than the server's
`grace_seconds`, the time after which the server itself counts the worker unreachable. Times are the wall clock:
the writer and the reader are on one machine (one container).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

FILE = "health.json"


class WorkerHealth(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    worker: str
    pid: int
    acked_at: float  # the wall-clock time the acknowledged heartbeat was sent
    grace_seconds: float  # the server's: after this much silence it counts the worker unreachable


def path(workdir: Path) -> Path:
    return workdir / FILE


def write(workdir: Path, health: WorkerHealth) -> None:
    """Replace the record at once (a reader sees the old one or the new); not fsynced: a crash loses nothing that the
    next heartbeat does not write again."""
    target = path(workdir)
    tmp = target.with_name(f".{FILE}.{os.getpid()}")
    tmp.write_text(health.model_dump_json())
    os.replace(tmp, target)


def verdict(workdir: Path, now: float | None = None) -> tuple[bool, str]:
    """(healthy, one line saying why) for the worker whose dir is `workdir`."""
    try:
        h = WorkerHealth.model_validate_json(path(workdir).read_text())
    except FileNotFoundError:
        return False, f"no acknowledged heartbeat yet ({path(workdir)} does not exist)"
    except (OSError, ValidationError) as e:
        return False, f"{path(workdir)} cannot be read: {e.__class__.__name__}"
    age = (time.time() if now is None else now) - h.acked_at
    if not _alive(h.pid):
        return False, f"worker {h.worker}: its process (pid {h.pid}) is not running"
    if age > h.grace_seconds:
        return False, (
            f"worker {h.worker}: its last acknowledged heartbeat was {age:.0f}s ago, longer than the server's "
            f"grace_seconds ({h.grace_seconds:g}s)"
        )
    return True, f"worker {h.worker}: heartbeat acknowledged {max(age, 0):.0f}s ago"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
