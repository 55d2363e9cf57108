"""Memory cgroups for jobs with a grant: cgroup v2 where a writable subtree has the memory controller,
else v1's memory hierarchy. Where neither works, `Cgroups.reason` says why, once, at the worker's start.

Each job gets a group of its own for its life, at its memory limit; the job process joins it before exec, so
everything it starts is counted. An out-of-memory kill and the job's peak memory are read back from the group's
counters. A group whose job ended empty is kept for a later job (`Cgroups.take`, `Cgroups.give`), as a slot's
files are.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from piloop_common.files import read_file, write_file
from piloop_common.host.cgroupmem import CGROUP_ROOT, own_path

SLOT_GROUP = "-slot-"  # in the name of a slot's own group (`Cgroups.slot`): it runs that slot's jobs alone
OOM_KILL = re.compile(r"^oom_kill (\d+)$", re.M)  # compiled here, in the shim host: each shim would compile it again


class JobCgroup(NamedTuple):  # not a dataclass: the shim host imports this, and dataclasses brings inspect and ast
    path: Path
    version: int

    def slots_own(self) -> bool:
        """Whether this is a slot's own group, which no other slot's job uses."""
        return SLOT_GROUP in self.path.name

    def join_path(self) -> Path:
        """The file a process writes its pid to, to join."""
        return self.path / "cgroup.procs"

    @contextlib.contextmanager
    def entered(self) -> Iterator[bool]:
        """This process in the group for the moment of a spawn, then back in its own: a child spawned meanwhile is
        born in the group, so nothing of it runs outside, without a `preexec_fn` (which makes Python fork the whole
        shim, ~4.5 ms, where a vfork and exec cost ~0.8). Yields False, having moved nothing, where the group cannot be
        entered or left again; the caller then has the child join the group itself."""
        me = str(os.getpid())
        own = own_procs(self.version)
        if own is None:
            yield False
            return
        try:
            write_file(self.join_path(), me)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            try:
                write_file(own, me)
            except OSError as e:  # never raised: the job is spawned by now, and the shim must go on to supervise it
                print(
                    f"shim: cannot leave the job's cgroup {self.path} ({e}): it may be killed with the job",
                    file=sys.stderr,
                    flush=True,
                )

    def oom_kills(self) -> int:
        if self.version == 2:
            m = OOM_KILL.search(_read(self.path / "memory.events"))
            return int(m.group(1)) if m else 0
        m = OOM_KILL.search(_read(self.path / "memory.oom_control"))
        return int(m.group(1)) if m else 0

    def usage_bytes(self) -> int:
        """The memory charged to the group now (page cache included, as the limit counts it)."""
        raw = _read(self.path / ("memory.current" if self.version == 2 else "memory.usage_in_bytes")).strip()
        return int(raw) if raw.isdigit() else 0

    def refaults(self) -> int:
        """Pages the group evicted and then needed again (`workingset_refault*`): the sign of thrashing."""
        total = 0
        for line in _read(self.path / "memory.stat").splitlines():
            name, _, value = line.partition(" ")
            if name.startswith("workingset_refault") and value.strip().isdigit():
                total += int(value)
        return total

    def peak_watch(self) -> PeakWatch | None:
        """The group's peak memory counted from now (`PeakWatch`), or None where the kernel cannot count it so."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            f = open(self.path / name, "r+b", buffering=0)
        except OSError:  # v2 before Linux 5.19 has no memory.peak, and before 6.12 it is read-only
            return None
        try:
            f.write(b"0")
        except OSError:
            f.close()
            return None
        return PeakWatch(f)

    def pids(self) -> list[int]:
        return [int(x) for x in _read(self.path / "cgroup.procs").split()]

    def kill_all(self) -> None:
        """SIGKILL every process in the group, even those that left the job's process group."""
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                write_file(self.path / "cgroup.kill", "1")
                return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, 9)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


class PeakWatch:
    """The most memory a job's group is charged from the moment its peak was reset (page cache included, as the limit
    counts it): the kernel's count, which misses no short peak and counts a page two processes share once.

    A kept group's peak is its earlier jobs' too, so the shim resets it before each job starts: v1's
    (`memory.max_usage_in_bytes`) for the group, v2's (`memory.peak`, writable from Linux 6.12) only for reads through
    the descriptor that wrote it, which the shim holds to the job's end. Where v2's cannot be reset (5.19 to 6.11) the
    shim keeps its sampled peak for every job: a new group's first job could have the kernel's count, but most jobs
    run in a kept group, and a new group for each job would cost it ~0.3 ms (`Cgroups.take`) to have it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file  # a file, not a bare descriptor: a shim that fails midway drops it, which closes it

    def peak_bytes(self) -> int | None:
        """The peak since the reset, read once the job has ended (the file is closed then); None where unreadable."""
        with self.file:
            try:
                raw = os.pread(self.file.fileno(), 64, 0).strip()
            except OSError:
                return None
        return int(raw) if raw.isdigit() else None

    def close(self) -> None:
        self.file.close()


class HeldWatch:
    """Since when a job has been held at its memory limit: its usage near the limit while it keeps refaulting
    pages it had to give up. The kernel kills a job that cannot fit at all; one that just fits thrashes (it
    reclaims and reads back its own pages, making little progress) and is never killed, so the shim stops it
    once it has been held there `seconds`. A job that streams through more data than its limit reads each page
    once and does not refault, so it is not held."""

    NEAR = 0.9  # of the limit: reclaim keeps usage a little under it
    SLACK = 1.5  # seconds without a held sample before a hold counts as over (refaults come in bursts)

    def __init__(self, limit_bytes: int, seconds: float) -> None:
        self.limit, self.seconds = limit_bytes, seconds
        self.since: float | None = None
        self.last = 0.0
        self.seen: int | None = None

    def observe(self, now: float, usage: int, refaults: int) -> bool:
        """Record one sample; whether the job has now been held at its limit for `seconds`."""
        rose = self.seen is not None and refaults > self.seen
        self.seen = refaults
        if rose and usage >= self.NEAR * self.limit:
            if self.since is None:
                self.since = now
            self.last = now
        elif self.since is not None and now - self.last > self.SLACK:
            self.since = None
        return self.since is not None and now - self.since >= self.seconds


@functools.cache
def own_procs(version: int, root: Path = CGROUP_ROOT) -> Path | None:
    """The `cgroup.procs` of this process's own group, or None where it is not writable. Cached: the shim host
    asks first, and its shims, in its group too, inherit the answer."""
    base = root if version == 2 else root / "memory"
    procs = base / own_path(None if version == 2 else "memory").lstrip("/") / "cgroup.procs"
    return procs if os.access(procs, os.W_OK) else None


def _read(p: Path) -> str:
    try:
        return read_file(p)
    except OSError:
        return ""


class Cgroups:
    """Where this worker's job cgroups go (`base`), or why there are none (`reason`)."""

    MOST = 16  # spare groups kept: about a worker's slots

    def __init__(self, name: str, root: Path = CGROUP_ROOT) -> None:
        self.base: Path | None = None
        self.version = 0
        self.reason = ""
        self.limits: dict[Path, int] = {}  # every group this worker made and has not removed -> its limit (bytes)
        self.spare: list[JobCgroup] = []
        self.made = 0
        reasons = []
        for try_ in (self._v2, self._v1):
            why = try_(name, root)
            if not why:
                return
            reasons.append(why)
        self.reason = "; ".join(reasons)

    @property
    def available(self) -> bool:
        return self.base is not None

    def _v2(self, name: str, root: Path) -> str:
        if not (root / "cgroup.controllers").exists():
            return "no cgroup v2 hierarchy at " + str(root)
        if "memory" not in _read(root / "cgroup.controllers").split():
            return "cgroup v2 has no memory controller"
        own = root / own_path(None).lstrip("/")
        # a cgroup with processes cannot give controllers to children (no internal processes), so
        # our jobs go in a sibling of our own cgroup where we may write to its parent
        last = ""
        for parent in (own.parent if own != root else root, own):
            base = parent / f"piloop-{name}"
            try:
                base.mkdir(exist_ok=True)
                if "memory" not in _read(parent / "cgroup.subtree_control").split():
                    (parent / "cgroup.subtree_control").write_text("+memory")
                (base / "cgroup.subtree_control").write_text("+memory")
            except OSError as e:
                last = f"cgroup v2 at {parent} is not writable here ({e.strerror})"
                continue
            self.base, self.version = base, 2
            return ""
        return last

    def _v1(self, name: str, root: Path) -> str:
        mem = root / "memory"
        if not (mem / "memory.limit_in_bytes").exists():
            return "no cgroup v1 memory controller"
        last = ""
        for parent in (mem / own_path("memory").lstrip("/"), mem):
            base = parent / f"piloop-{name}"
            try:
                base.mkdir(exist_ok=True)
                probe = base / ".probe"
                probe.mkdir(exist_ok=True)
                probe.rmdir()
            except OSError as e:
                last = f"cgroup v1 memory at {parent} is not writable here ({e.strerror})"
                continue
            self.base, self.version = base, 1
            return ""
        return last

    def create(self, name: str, memory_mb: int) -> JobCgroup:
        """A new cgroup `name`, limited to `memory_mb` (raises OSError where the kernel refuses, FileExistsError where
        `name` is taken)."""
        assert self.base is not None
        path = self.base / name
        path.mkdir()
        try:
            self._limit(path, memory_mb << 20, None)
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        self.limits[path] = memory_mb << 20
        return JobCgroup(path, self.version)

    def take(self, memory_mb: int) -> JobCgroup:
        """A group for one job, limited to `memory_mb`: a spare one, else a new one (`<base>/<pid>-<n>`).

        A group made and removed per job cost ~0.3 ms of the machine's CPU (the kernel's making and offlining it);
        a spare costs its limit written, and only when it changes. A spare may still be charged page cache its last
        job left; the kernel reclaims it first when the next job nears its limit, so it never counts against the job
        as memory in use (emptying it eagerly, `memory.force_empty`, cost ~1 ms a job)."""
        limit = memory_mb << 20
        while self.spare:
            cg = self.spare.pop()
            had = self.limits[cg.path]
            try:
                if had != limit:
                    self._limit(cg.path, limit, had)
                    self.limits[cg.path] = limit
                return cg
            except OSError:  # gone, or v1 could not reclaim down to a lower limit: a new one
                del self.limits[cg.path]
                cg.remove()
        while True:
            self.made += 1
            with contextlib.suppress(FileExistsError):  # a name an earlier worker of the same pid left in use
                return self.create(f"{os.getpid()}-{self.made}", memory_mb)

    def slot(self, n: int, memory_mb: int) -> JobCgroup:
        """Slot `n`'s group, `<base>/<pid>-slot-<n>`, made at the slot's first job and kept for the worker's life (the
        pid its: workers that share a base, on one host under one name, never share a slot's group), limited
        to `memory_mb` for the job the slot runs now (its limit written only when it changes). The supervisor resets
        its peak and reads its OOM count per job. OSError where the kernel refuses the limit."""
        assert self.base is not None
        path = self.base / f"{os.getpid()}{SLOT_GROUP}{n}"
        limit = memory_mb << 20
        had = self.limits.get(path)
        if had is None:
            try:
                path.mkdir()
            except FileExistsError:
                pass  # an earlier worker's of the same pid, which the sweep at start left
            self._limit(path, limit, None)
            self.limits[path] = limit
        elif had != limit:
            self._limit(path, limit, had)
            self.limits[path] = limit
        return JobCgroup(path, self.version)

    def give(self, cg: JobCgroup) -> None:
        """`cg` back once its job's exit record is written (the shim has killed and reaped all of it): kept for a
        later job while it is empty and there are fewer than `MOST` spares, else removed. A group this worker did not
        make (a re-attached job's) is removed."""
        if cg.path in self.limits and cg.slots_own():
            return  # the slot's, kept for its next job
        if cg.path in self.limits and len(self.spare) < self.MOST and not cg.pids() and cg.path.is_dir():
            self.spare.append(cg)
            return
        self.limits.pop(cg.path, None)
        cg.remove()

    def sweep(self, keep: set[Path]) -> list[Path]:
        """Remove the empty groups an earlier worker left under `base` (those of the jobs in `keep`, and of a live
        worker's pid sharing the base, stay); the ones removed."""
        gone: list[Path] = []
        if self.base is None:
            return gone
        with contextlib.suppress(OSError):
            for p in self.base.iterdir():
                owner = p.name.split("-", 1)[0]
                if (
                    not p.is_dir()
                    or p in keep
                    or (owner.isdigit() and owner != str(os.getpid()) and Path(f"/proc/{owner}").exists())
                ):
                    continue
                try:
                    p.rmdir()  # refused while a process is in it
                except OSError:
                    continue
                gone.append(p)
        return gone

    def close(self) -> None:
        """Remove the spares and the slots' groups (the groups of jobs still running stay theirs)."""
        while self.spare:
            cg = self.spare.pop()
            self.limits.pop(cg.path, None)
            cg.remove()
        for path in [p for p in self.limits if SLOT_GROUP in p.name]:
            self.limits.pop(path)
            JobCgroup(path, self.version).remove()

    def _limit(self, path: Path, limit: int, had: int | None) -> None:
        """Write `limit` (bytes) to the group at `path`, whose limit was `had` (None: a new group)."""
        if self.version == 2:
            write_file(path / "memory.max", str(limit))
            if had is None:
                with contextlib.suppress(OSError):
                    write_file(path / "memory.swap.max", "0")
            return
        # v1 keeps memsw >= the memory limit at every write: raise memsw first, lower it last
        memsw = path / "memory.memsw.limit_in_bytes"
        if had is not None and limit > had:
            with contextlib.suppress(OSError):
                write_file(memsw, str(limit))
        write_file(path / "memory.limit_in_bytes", str(limit))
        if had is None or limit < had:
            with contextlib.suppress(OSError):
                write_file(memsw, str(limit))
        if had is None:
            with contextlib.suppress(OSError):
                write_file(path / "memory.swappiness", "0")
