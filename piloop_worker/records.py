"""Records that cross a process boundary between the worker and a slot's supervisor, typed once: why a job was
stopped, the cgroup a job is granted, and how a job ended (its exit record, with its usage). Typed tuples and an enum,
no pydantic: a slot's supervisor and its task processes import this. Unknown fields in a record are ignored, so either
side may be newer by a field. `atomic_write` is how either side writes a file another process reads.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from piloop_common.files import temp_beside, write_all

# an exit record (`ended.json`) and a report (`Spool`) of a job this long are made durable (fsynced, spooled)
DURABLE_AFTER_SECONDS = 1.0


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


def _known(fields: tuple[str, ...], d: dict[str, Any]) -> dict[str, Any]:
    """The entries of `d` that are `fields` of a record (a record from another release may have more)."""
    return {k: v for k, v in d.items() if k in fields}
