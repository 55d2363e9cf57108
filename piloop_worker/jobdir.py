"""One job directory per lease: what the worker and the job's shim share on disk.

Layout of `<dir>/jobs/<job>.<token>/`, on the worker's `--dir`:

    job.json      the assignment, minus secret values          (worker, before the shim starts)
    deadline      a CLOCK_BOOTTIME time: fence after it          (worker, in place, at each acknowledged renewal)
    stop          why the worker wants the job stopped          (worker)
    lock          flock'd by the shim for as long as it lives   (shim)
    shim.json     the shim's and the job's pids                 (shim)
    shim.log      the shim's own output while it runs the job   (shim)
    exit.json     how the job ended, with its usage             (shim, atomically, last)
    log.json      how much of output.log is in the CAS          (worker)
    relay.sock    the job's relay                               (worker)
    output.log    the job's stdout and stderr                   (job)
    metrics.jsonl host metrics every few seconds                (shim)
    inputs/ outputs/ work/                                      (worker, with the first input / job / job's cwd)

All of it is on the one filesystem the worker was given, so a full one is one fault with one answer (`disk_full`,
docs/worker.md), not a RAM filesystem beside it that a job could fill for every job of the worker (/dev/shm is 64 MB
in a container by default). The deadline, renewed every heartbeat, is rewritten in place: it needs no block of its
own while the disk is full, so a job filling the dir does not fence its neighbours.

Every other file another process reads is written atomically (a temp file, then a rename), so a reader sees the old
content or the new, never a part. `exit.json` is fsynced when its job ran `DURABLE_AFTER_SECONDS` or longer: what the
fsync buys is the record through a crash of the machine, without which the lease expires and the job runs again,
which costs less than an fsync for a short job. After a reboot the worker finds each job dir without a live shim:
one with an exit record is reported, one without is reported lost, and its job is queued again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from piloop_common.files import read_file, temp_beside, write_all, write_file
from piloop_worker.lease import HeldLease
from piloop_worker.shimproto import ExitRecord, ShimRecord, StopReason
from piloop_worker.sparedirs import SpareDirs, rmtree

if TYPE_CHECKING:  # the shim host imports this module, and a task's fork pays for pydantic (test_worker_parts)
    from piloop_worker.jobrecord import JobRecord


def atomic_write(path: Path, data: bytes | str, mode: int = 0o600, durable: bool = True) -> None:
    """Write `path` so a reader sees the old content or the new, never a part; `durable`: fsynced before the rename,
    so a crash of the machine leaves the old content or the new too."""
    fd, tmp = temp_beside(path)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_json(path: Path, obj: Any, durable: bool = True) -> None:
    atomic_write(path, json.dumps(obj, sort_keys=True), durable=durable)


def files_under(root: Path) -> list[tuple[str, str]]:
    """Each file under `root`, as (its path from `root` with `/`, its path), in the order of `sorted(root.rglob("*"))`
    and with the same rule: a symlink to a file counts, a symlinked dir is not entered; none where `root` is not a
    dir. Through os.scandir: a job's outputs are listed once a job, and pathlib's glob made a Path per entry."""
    found: list[tuple[tuple[str, ...], str]] = []
    me = os.geteuid()

    def walk(path: str, parts: tuple[str, ...]) -> None:
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except (NotADirectoryError, FileNotFoundError, PermissionError):
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                walk(e.path, (*parts, e.name))
            elif e.is_file() and (not e.is_symlink() or e.stat(follow_symlinks=False).st_uid == me):
                # a symlink of another user's (a job run as one: `jobuser`) is not followed: as root, this
                # process would read whatever it points at, the worker's token file too
                found.append(((*parts, e.name), e.path))

    walk(str(root), ())
    found.sort()
    return [("/".join(parts), path) for parts, path in found]


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(read_file(path))
    except (OSError, ValueError):
        return None


def _path(name: str) -> cached_property[Path]:
    """A path in the job's data dir, made on first use and kept."""
    return cached_property(lambda self: self.root / name)


FULL_BELOW = 1 << 20  # a data dir with less room than this is full: no job starts there, and one that failed ran out
DURABLE_AFTER_SECONDS = 1.0  # an exit record (and a report, `Spool`) of a job this long is fsynced


class JobDir:
    """The paths of one job's directories, and the small protocol on them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_lease(cls, workdir: Path, job: str, token: str) -> JobDir:
        """Named by the lease's name (`HeldLease.name`): with the token's random part the relay's socket path would
        pass AF_UNIX's limit sooner, and a job then pays a temp dir for it (a process job's drain fell from 259 to 144
        jobs/s, docs/performance.md)."""
        return cls.named(workdir, HeldLease(job, token).name)

    @classmethod
    def named(cls, workdir: Path, name: str) -> JobDir:
        """The job dir `name` of the worker whose `--dir` is `workdir`."""
        return cls(workdir / "jobs" / name)

    def __repr__(self) -> str:
        return f"JobDir({self.root})"

    # -- paths ----------------------------------------------------------------------------
    # made once each: the worker's loop asks for some of them on every tick, for every job it holds
    job_json = _path("job.json")
    deadline_file = _path("deadline")
    stop_file = _path("stop")
    lock_file = _path("lock")
    shim_json = _path("shim.json")
    shim_log = _path("shim.log")
    exit_json = _path("exit.json")
    log_state = _path("log.json")
    fetched_file = _path("fetched_bytes")
    output_log = _path("output.log")
    metrics = _path("metrics.jsonl")
    inputs = _path("inputs")
    outputs = _path("outputs")
    work = _path("work")
    workspace = _path("workspace")  # a campaign agent's copy of the shared workspace

    def create(self, job_record: JobRecord, deadline: float | None = None, spare: SpareDirs | None = None) -> None:
        """The dirs with `work/` and `outputs/` (`inputs/` comes with the first input; a `spare` dir, emptied by an
        earlier job, where there is one), `job.json` and the first deadline. Those two are written in place, not
        through a temp file and a rename (a file made and one deleted, per job): no shim reads them yet, and a worker
        that dies halfway leaves a `job.json` it cannot read, so it drops the dir, and the lease, never renewed,
        expires and the job is queued again."""
        fresh = spare is None or not spare.take(self.root)
        if fresh:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.full():  # where a mkdir still succeeds on a full disk (tmpfs), the job's first write would not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.root))
        if fresh:
            for d in (self.outputs, self.work):
                d.mkdir(exist_ok=True)
        write_file(self.job_json, job_record.to_json())
        if deadline is not None:
            write_file(self.deadline_file, _deadline_text(deadline))

    def remove(self, spare: SpareDirs | None = None) -> None:
        """The dir, emptied and kept as a `spare` where it takes it."""
        if spare is None or not spare.give(self.root):
            rmtree(self.root, ignore_errors=True)

    def record(self) -> JobRecord | None:
        """The job's record; None where the dir has none. BadJobRecord when `job.json` is not one (a worker that died
        writing it left a part)."""
        from piloop_worker.jobrecord import BadJobRecord, JobRecord  # the worker's side only: pydantic

        try:
            text = read_file(self.job_json)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise BadJobRecord(f"{self.job_json}: cannot be read ({e})") from e
        return JobRecord.from_json(text, str(self.job_json))

    def write_fetched(self, n: int) -> None:
        atomic_write(self.fetched_file, str(int(n)))

    def read_fetched(self) -> int:
        try:
            return int(read_file(self.fetched_file))
        except (OSError, ValueError):
            return 0

    # -- the deadline ---------------------------------------------------------------------
    def write_deadline(self, deadline: float) -> None:
        """Rewrite the deadline in place, one write of a fixed width at offset 0: a block the file has already, so it
        is renewed while a neighbour job fills the disk, and no file is made and freed per heartbeat."""
        fd = os.open(self.deadline_file, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, _deadline_text(deadline).encode(), 0)
        finally:
            os.close(fd)

    def read_deadline(self) -> float | None:
        """The deadline; None where there is none (the shim then fences). The value is written twice on one line: a
        read that met a write halfway sees two that differ, and reads again."""
        for _ in range(3):
            try:
                first, _, second = read_file(self.deadline_file).strip().partition(" ")
                if first == second:
                    return float(first)
            except (OSError, ValueError):
                return None
        return None

    # -- stop requests --------------------------------------------------------------------
    def request_stop(self, why: StopReason) -> None:
        """Ask the shim to stop the job; the first reason given wins."""
        if not self.stop_file.exists():
            atomic_write(self.stop_file, why.value, durable=False)

    def stop_reason(self) -> StopReason | None:
        try:
            return StopReason.read(read_file(self.stop_file))
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

    def exit_record(self) -> ExitRecord | None:
        """The job's exit record; None while there is none (or it cannot be read)."""
        try:
            return ExitRecord.parse(read_file(self.exit_json))
        except (OSError, ValueError, TypeError):
            return None

    def shim_record(self) -> ShimRecord | None:
        try:
            return ShimRecord.parse(read_file(self.shim_json))
        except (OSError, ValueError, TypeError):
            return None

    def write_shim(self, record: ShimRecord) -> None:
        atomic_write(self.shim_json, record.wire(), durable=False)

    def full(self) -> bool:
        """Whether the job's data dir is (all but) out of room: a job that failed there most likely failed for it."""
        try:
            st = os.statvfs(self.root)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < FULL_BELOW

    def write_exit(self, record: ExitRecord) -> None:
        """Write the exit record, with `disk_full` where a job that failed left its data dir full. Where the record
        itself meets a full disk, first free the job's scratch `work/` (never reported, removed with
        the dir once reported anyway), so a job that filled its worker's dir still ends with a record."""
        if record.exit_code != 0 and not record.disk_full and self.full():
            record = _disk_full(record, "No space left on device")
        durable = record.duration_seconds >= DURABLE_AFTER_SECONDS
        try:
            atomic_write(self.exit_json, record.wire(), durable=durable)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            rmtree(self.work, ignore_errors=True)
            atomic_write(self.exit_json, _disk_full(record, e.strerror or "no room").wire(), durable=durable)


def _disk_full(record: ExitRecord, why: str) -> ExitRecord:
    if record.exit_code != 0 and not record.reason:
        return record._replace(disk_full=True, reason=f"disk_full: the worker's dir is full ({why})")
    return record._replace(disk_full=True)


def _deadline_text(deadline: float) -> str:
    """Of one width for any deadline of this boot (CLOCK_BOOTTIME seconds below 10**13), so a rewrite in place
    leaves nothing of the one before."""
    one = f"{float(deadline):020.6f}"
    return f"{one} {one}\n"


def scan(workdir: Path) -> list[JobDir]:
    """Every job directory under `workdir`, oldest first."""
    jobs = workdir / "jobs"
    names = [p.name for p in jobs.iterdir() if p.is_dir() and not p.name.startswith(".")] if jobs.is_dir() else []
    dirs = [JobDir.named(workdir, n) for n in names]
    return sorted(dirs, key=lambda d: d.root.stat().st_mtime)
