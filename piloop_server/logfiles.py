"""The daemon's own log files under `$PILOOP_HOME`, bounded by logrotate's `copytruncate` rule.

Each is written by a process (the detached daemon, its worker `serve`, the rq workers, the started workers, the
embedded Redis) through a descriptor opened for appending and inherited, so no logging handler in this process can
rename it away from its writer. The daemon copies a file over `[plugins.retention] log_max_bytes` to `<name>.1`
(older copies shift up to `log_keep`; beyond it they are removed) and truncates the original to 0: an `O_APPEND`
writer's next write lands at the new end. What is written between the copy and the truncate is lost (a window of
one file copy). Only the files named here are touched, never anything else in the home.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from piloop_server.provisioner.local import WORKER_LOG, homes
from piloop_server.state import embedded

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime

log = logging.getLogger("piloop.logfiles")

LOGS = "logs"  # under the home
DAEMON_LOG = "daemon.log"  # the detached daemon's stdout and stderr (`piloop serve --detach`)
SERVE_WORKER_LOG = "worker-serve.log"  # the daemon's own worker `serve`
# how often the pass looks (and once at its first pass). Tests shorten it with this env.
CHECK_SECONDS = 60.0
CHECK_ENV = "PILOOP_LOG_CHECK_SECONDS"


def logs_dir(home: Path) -> Path:
    return home / LOGS


def tasks_log(queue: str) -> str:
    """The log of the rq worker of one queue."""
    return f"tasks-{queue}.log"


def known(home: Path, queues: Iterable[str]) -> list[Path]:
    """Every log file the daemon and its children write under `home` (whether or not it exists yet)."""
    d = logs_dir(home)
    out = [d / DAEMON_LOG, d / SERVE_WORKER_LOG, *(d / tasks_log(q) for q in queues), embedded.log_path(home)]
    with contextlib.suppress(OSError):
        out += sorted(h / WORKER_LOG for h in homes(home).iterdir() if h.is_dir())
    return out


def copy_path(path: Path, n: int) -> Path:
    """The `n`th newest rotated copy of `path`: `<name>.<n>`."""
    return path.with_name(f"{path.name}.{n}")


def rotate(path: Path, max_bytes: int, keep: int) -> int:
    """Copy `path` to `<name>.1` and truncate it when it holds more than `max_bytes` (0: never); keep `keep`
    copies, removing older ones. The bytes it held when rotated, or 0 when left alone (missing, or small)."""
    if max_bytes <= 0:
        return 0
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size <= max_bytes:
        return 0
    _drop_copies(path, keep)
    for n in range(keep - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.replace(copy_path(path, n), copy_path(path, n + 1))
    if keep > 0:
        tmp = path.with_name(f"{path.name}.1.tmp")  # a crash mid-copy leaves no half `.1`
        shutil.copyfile(path, tmp)
        os.replace(tmp, copy_path(path, 1))
    os.truncate(path, 0)
    return size


def _drop_copies(path: Path, keep: int) -> None:
    """Remove the copies of `path` numbered `keep` and above (the one at `keep` is about to be shifted out)."""
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)")
    with contextlib.suppress(FileNotFoundError):
        for entry in path.parent.iterdir():
            m = pattern.fullmatch(entry.name)
            if m and int(m.group(1)) >= max(keep, 1):
                entry.unlink(missing_ok=True)


def check_seconds() -> float:
    raw = os.environ.get(CHECK_ENV, "").strip()
    try:
        return float(raw) if raw else CHECK_SECONDS
    except ValueError:
        return CHECK_SECONDS


class RotationSchedule:
    """The pass's part: rotate the known logs over `log_max_bytes` at the first pass and once every CHECK_SECONDS."""

    def __init__(self) -> None:
        self.checked_at: float | None = None  # monotonic

    def tick(self, rt: Runtime, queues: Iterable[str]) -> list[Path]:
        """Rotate what is due (the daemon's logs and those of the rq workers of `queues`); the files rotated."""
        now = time.monotonic()
        if self.checked_at is not None and now - self.checked_at < check_seconds():
            return []
        self.checked_at = now
        ret = rt.settings.plugins.retention
        if ret.log_max_bytes <= 0:
            return []
        rotated = []
        for path in known(rt.home, queues):
            try:
                size = rotate(path, ret.log_max_bytes, ret.log_keep)
            except OSError as e:  # a full disk or a file made unreadable: the next check tries again
                log.warning("event=log.rotate_failed path=%s error=%s", path, e)
                continue
            if size:
                rotated.append(path)
                log.info("event=log.rotated path=%s bytes=%d keep=%d", path, size, ret.log_keep)
        return rotated
