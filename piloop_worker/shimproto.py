"""The worker↔shim protocol, defined once: the request that starts a job under a shim, the record of the shim in the
job's dir (`shim.json`), the job's exit record (`exit.json`), and why a job was stopped.

The shim host imports this and every fork of it copies what it holds: typed tuples and an enum, no pydantic.
Unknown fields in a record on disk are ignored, so a worker reads the records of a shim from the release before.
"""

from __future__ import annotations

import enum
import json
from typing import Any, NamedTuple


class StopReason(enum.StrEnum):
    """Why a job was stopped before it ended by itself: the worker's word in its `stop` file, or the shim's own."""

    NONE = ""
    FENCED = "fenced"  # its deadline passed: no renewal reached it in time (the shim's own)
    TIMEOUT = "timeout"  # the spec's timeout_seconds (the shim's own)
    MEMORY_HELD = "memory_held"  # thrashing at its memory limit for memory_held_seconds (the shim's own)
    SHIM_TERMINATED = "shim terminated"  # the shim had a SIGTERM
    SUPERVISOR_TERMINATED = "supervisor terminated"  # the slot's supervisor had a SIGTERM (`slots/`)
    CANCELLED = "cancelled"
    LOST = "lost"  # the server says its lease is gone
    LEASE_LOST = "lease_lost"  # a call under its lease was refused as lost
    REFUSED = "refused"  # the server refused the worker
    STOPPED = "stopped"  # a stop file the worker wrote but no reason could be read from

    @classmethod
    def read(cls, text: str) -> StopReason:
        try:
            return cls(text.strip())
        except ValueError:
            return cls.STOPPED


class CgroupGrant(NamedTuple):
    """The memory cgroup a job runs in, and what the shim watches in it."""

    path: str
    version: int
    limit_mb: int | None = None
    held_seconds: float | None = None


class ShimRequest(NamedTuple):
    """What the worker sends the shim host (a line) or an idle shim (a datagram) to start one job.

    `env` is what the job adds to the shim host's environment (`shim.job_env`); it carries the job's secret values,
    which cross a pipe or a socket pair and are never written to disk. With `task` (`module:function`) the shim forks
    the task's process from itself instead of exec'ing `argv`."""

    dir: str
    argv: list[str]
    env: dict[str, str]
    kill_grace: float = 5.0
    timeout: float | None = None
    cgroup: CgroupGrant | None = None
    metrics_seconds: float = 5.0
    task: str | None = None
    user: dict[str, Any] | None = None  # jobuser.JobUser.wire(): the user the job runs as
    code: str | None = None  # a task's shipped code, unpacked (`taskcode.CodeCache`): never preloaded by the host
    worker: str = ""  # the worker's name, for a task's one-line reason when its module cannot be imported
    # a task in the shim's warm process (`warm.py`), not a fork of its own: the tasks and resident MiB past which
    # that process is replaced; 0: a fresh fork
    warm_max_tasks: int = 0
    warm_max_rss_mb: int = 0

    def wire(self) -> bytes:
        d = self._asdict()
        if self.cgroup is not None:
            d["cgroup"] = self.cgroup._asdict()
        return json.dumps(d).encode()

    @classmethod
    def parse(cls, raw: bytes | str) -> ShimRequest:
        """A request off the wire; ValueError (or a KeyError's TypeError) when it is not one."""
        d = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError("a shim request is a JSON object")
        cg = d.get("cgroup")
        return cls(
            **{**_known(cls._fields, d), "cgroup": CgroupGrant(**_known(CgroupGrant._fields, cg)) if cg else None}
        )


class ShimRecord(NamedTuple):
    """`shim.json`: the shim and its job's leader, written once the job started."""

    shim: int
    pid: int
    pgid: int
    started: float  # the job's start, wall clock: with `pgid`, tells its group from a later one with the same id
    cgroup: str | None = None

    def wire(self) -> bytes:
        return json.dumps(self._asdict()).encode()

    @classmethod
    def parse(cls, raw: bytes | str) -> ShimRecord:
        return cls(**_known(cls._fields, json.loads(raw)))


class UsageRecord(NamedTuple):
    peak_rss_bytes: int = 0
    cpu_seconds: float = 0.0


class ExitRecord(NamedTuple):
    """`exit.json`: how a job ended, written once by its shim (or by the worker for a job that never ran, or whose
    shim died: `lost`). The worker's report is built from it (`outcome`)."""

    exit_code: int | None = None
    signal: int | None = None
    oom: bool = False
    stopped: StopReason = StopReason.NONE
    lost: bool = False  # the shim died before the job ended
    reason: str = ""
    disk_full: bool = False  # it failed with the worker's dir full
    usage: UsageRecord = UsageRecord()
    duration_seconds: float = 0.0
    started: float | None = None
    ended: float | None = None
    error: tuple[str, ...] = ()  # a task that raised: its exception's classes, qualified, its own first

    def wire(self) -> bytes:
        return json.dumps({**self._asdict(), "usage": self.usage._asdict()}).encode()

    @classmethod
    def parse(cls, raw: bytes | str) -> ExitRecord:
        d = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError("an exit record is a JSON object")
        return cls(
            **{
                **_known(cls._fields, d),
                "stopped": StopReason.read(d.get("stopped") or ""),
                "usage": UsageRecord(**_known(UsageRecord._fields, d.get("usage") or {})),
                "error": tuple(str(c) for c in d.get("error") or ()),
            }
        )

    def outcome(self) -> tuple[str, str]:
        """The report's outcome and reason."""
        s = self.stopped
        if self.lost:
            return "lost", self.reason or "the job's shim is gone"
        if s is StopReason.FENCED:
            return "fenced", "the worker could not renew the lease before its deadline"
        if s in (StopReason.LOST, StopReason.LEASE_LOST):
            return "lost", "the server says the lease is lost"
        if s is StopReason.CANCELLED:
            return "cancelled", "cancelled"
        if s is StopReason.REFUSED:
            return "lost", "the server refused the worker"
        if s is StopReason.SHIM_TERMINATED:
            return "lost", "the job's shim was terminated"
        if s is StopReason.SUPERVISOR_TERMINATED:
            return "lost", "the slot's supervisor was terminated"
        if s is StopReason.TIMEOUT:
            return "failed", "timeout"
        if self.oom:
            return "failed", self.reason or "out of memory"
        if self.reason:
            return "failed", self.reason
        if self.exit_code == 0:
            return "succeeded", ""
        if self.signal:
            return "failed", f"killed by signal {self.signal}"
        return "failed", f"exit code {self.exit_code}"


def _known(fields: tuple[str, ...], d: dict[str, Any]) -> dict[str, Any]:
    """The entries of `d` that are `fields` of a record (a record from another release may have more)."""
    return {k: v for k, v in d.items() if k in fields}
