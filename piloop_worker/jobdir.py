"""One job directory per lease: what the worker and the job's shim share on disk.

Layout of `<dir>/jobs/<job>.<token>/`:

    job.json      the assignment, minus secret values          (worker, before the shim starts)
    deadline      a CLOCK_MONOTONIC float: fence after it       (worker, at each acknowledged renewal)
    stop          why the worker wants the job stopped          (worker: lost, cancelled, refused, lease_lost)
    lock          flock'd by the shim for as long as it lives   (shim)
    shim.json     the shim's and the job's pids                 (shim)
    exit.json     how the job ended, with its usage             (shim, atomically, last)
    output.log    the job's stdout and stderr                   (job)
    metrics.jsonl host metrics every few seconds                (shim)
    log.json      how much of output.log is in the CAS          (worker)
    inputs/ outputs/ work/                                      (worker, with the first input / job / job's cwd)

Every file another process reads is written atomically (a temp file, then a rename), so a reader sees the old
content or the new, never a part. Only what must outlive a crash of the machine is fsynced first: `exit.json` (how
the job ended, reported after a reboot). The rest is read by processes of the same boot only (the deadline is a
CLOCK_MONOTONIC time, meaningless after a reboot; `shim.json` names pids; `stop` asks a shim that a reboot killed;
`log.json` lost means chunks uploaded again, which the CAS dedups; a `job.json` lost makes the worker drop the dir,
and the lease, never renewed, expires and the job is queued again), so the hot path skips their fsyncs (each ~1-4 ms
of the worker's loop on a busy disk).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes | str, mode: int = 0o600, durable: bool = True) -> None:
    """Write `path` so a reader sees the old content or the new, never a part; `durable`: fsynced before the rename,
    so a crash of the machine leaves the old content or the new too."""
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_json(path: Path, obj: Any, durable: bool = True) -> None:
    atomic_write(path, json.dumps(obj, sort_keys=True), durable=durable)


def _write_new(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _path(name: str) -> cached_property:
    """A path in the job's dir, made on first use and kept."""
    return cached_property(lambda self: self.root / name)


class JobDir:
    """The paths of one job's directory, and the small protocol on them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_lease(cls, workdir: Path, job: str, token: str) -> "JobDir":
        return cls(workdir / "jobs" / f"{job}.{token}")

    def __repr__(self) -> str:
        return f"JobDir({self.root})"

    # -- paths ----------------------------------------------------------------------------
    # made once each (`_path`): the worker's loop asks for some of them on every tick, for every job it holds
    job_json = _path("job.json")
    deadline_file = _path("deadline")
    stop_file = _path("stop")
    lock_file = _path("lock")
    shim_json = _path("shim.json")
    exit_json = _path("exit.json")
    output_log = _path("output.log")
    metrics = _path("metrics.jsonl")
    log_state = _path("log.json")
    inputs = _path("inputs")
    outputs = _path("outputs")
    work = _path("work")
    workspace = _path("workspace")  # a campaign agent's copy of the shared workspace
    fetched_file = _path("fetched_bytes")

    def create(self, job_record: dict[str, Any], deadline: float | None = None) -> None:
        """The dir with `work/` and `outputs/` (`inputs/` comes with the first input), `job.json` and the first
        deadline. Those two are written in place, not through a temp file and a rename (a file made and one
        deleted, per job): no shim reads them yet, and a worker that dies halfway leaves a `job.json` it cannot
        read, so it drops the dir, and the lease, never renewed, expires and the job is queued again."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for d in (self.outputs, self.work):
            d.mkdir(exist_ok=True)
        _write_new(self.job_json, json.dumps(job_record, sort_keys=True))
        if deadline is not None:
            _write_new(self.deadline_file, repr(float(deadline)))

    def record(self) -> dict[str, Any] | None:
        return read_json(self.job_json)

    def write_fetched(self, n: int) -> None:
        atomic_write(self.fetched_file, str(int(n)))

    def read_fetched(self) -> int:
        try:
            return int(self.fetched_file.read_text())
        except (OSError, ValueError):
            return 0

    # -- the deadline ---------------------------------------------------------------------
    def write_deadline(self, monotonic_deadline: float) -> None:
        atomic_write(self.deadline_file, repr(float(monotonic_deadline)), durable=False)

    def read_deadline(self) -> float | None:
        try:
            return float(self.deadline_file.read_text())
        except (OSError, ValueError):
            return None

    # -- stop requests --------------------------------------------------------------------
    def request_stop(self, why: str) -> None:
        """Ask the shim to stop the job; the first reason given wins."""
        if not self.stop_file.exists():
            atomic_write(self.stop_file, why, durable=False)

    def stop_reason(self) -> str | None:
        try:
            return self.stop_file.read_text().strip() or "stopped"
        except OSError:
            return None

    # -- the shim's liveness --------------------------------------------------------------
    def shim_alive(self) -> bool:
        """Whether a shim holds this dir's lock (flock dies with its holder, so a stale pid can't fool it)."""
        try:
            fd = os.open(self.lock_file, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def exit_record(self) -> dict[str, Any] | None:
        return read_json(self.exit_json)

    def write_exit(self, record: dict[str, Any]) -> None:
        """Write the exit record; on a full disk, first free the job's scratch `work/` (never reported, removed with
        the dir once reported anyway), so a job that filled its worker's dir still ends with a record."""
        try:
            atomic_json(self.exit_json, record)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            shutil.rmtree(self.work, ignore_errors=True)
            record = {**record, "disk_full": True}
            if record.get("exit_code") != 0 and not record.get("reason"):
                record["reason"] = f"the worker's dir is full ({e.strerror})"
            atomic_json(self.exit_json, record)


def scan(workdir: Path) -> list[JobDir]:
    """Every job directory under `workdir`, oldest first."""
    jobs = workdir / "jobs"
    if not jobs.is_dir():
        return []
    dirs = [JobDir(p) for p in jobs.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(dirs, key=lambda d: d.root.stat().st_mtime)
