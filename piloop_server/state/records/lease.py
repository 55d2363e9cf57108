"""The lease engine's records: what a lease, a heartbeat, a claim and a report are, the timings and caps the
scripts run under, and what a failed attempt does next (state/leases.py calls the scripts with them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from piloop_common.bytecaps import LOG_MAX_BYTES, RESULT_MAX_BYTES
from piloop_common.protocol.operator import JobResult
from piloop_common.protocol.worker import JobSpec, Kind
from piloop_server.state.scripts import EventCap

KINDS: tuple[Kind, ...] = ("agent", "evaluation")
BACKOFF_LONGEST_SECONDS = 3600
STALE_ADDRESSES = 16  # the CAS addresses a stale report's event names (its outputs first, then its log's ends)


def fence(token: str) -> int:
    """A token's fencing order (generation, then counter): it only grows."""
    return int(token.partition(".")[0])


@dataclass(frozen=True)
class Caps:
    """What one caller may make Redis hold ([plugins.state]): see docs/security.md."""

    events: EventCap = field(default_factory=EventCap)
    log_chunks: int = 20_000
    report_bytes: int = 256 * 1024
    progress_keep: int = 200  # the newest notes of a job that the server keeps
    log_bytes: int = LOG_MAX_BYTES
    result_bytes: int = RESULT_MAX_BYTES

    @classmethod
    def from_state(cls, st: Any) -> Caps:
        return cls(
            EventCap(st.events_max, st.event_value_bytes, st.inbox_max),
            st.log_chunks_max,
            st.report_max_bytes,
            st.progress_keep,
            st.log_max_bytes,
            st.result_max_bytes,
        )


@dataclass(frozen=True)
class RetryPolicy:
    """What report.lua does with a failed attempt, from the job's spec (its defaults are JobSpec's) and its pool."""

    max_attempts: int
    backoff_ms: int
    factor: float
    longest_ms: int
    growth: float
    memory_cap_mb: int  # 0: the worker's room
    retry_on: tuple[str, ...] = ()  # the exception classes a failed attempt is retried for; empty: any failure

    @classmethod
    def of(cls, spec_json: str | bytes | None, pool_cap_mb: int | None) -> RetryPolicy:
        try:
            spec = JobSpec.model_validate_json(spec_json or b"{}")
        except ValueError:
            spec = JobSpec(argv=["?"])  # a spec that no longer parses retries as the defaults say
        return cls(
            spec.max_attempts,
            int(spec.backoff_seconds * 1000),
            spec.backoff_factor,
            BACKOFF_LONGEST_SECONDS * 1000,
            spec.memory_growth,
            spec.memory_max_mb or pool_cap_mb or 0,
            tuple(spec.retry_on),
        )

    def args(self) -> list[Any]:
        """ARGV[12..17] of report.lua (`retry_on` goes after the stale summary, as ARGV[19])."""
        return [self.max_attempts, self.backoff_ms, self.factor, self.longest_ms, self.growth, self.memory_cap_mb]


def stale_summary(result: JobResult, stored: str) -> str:
    """What a stale report is kept as: its size (`stored`: the result as the job would keep it) and the CAS
    addresses it names, never its body."""
    named = [a for a in (*result.outputs.values(), result.metrics, result.bundle, result.workspace) if a]
    log = result.log
    ends = log[:2] + log[-2:] if len(log) > 4 else log
    return json.dumps({"bytes": len(stored), "log_chunks": len(log), "addresses": (named + ends)[:STALE_ADDRESSES]})


@dataclass(frozen=True)
class Lease:
    job: str
    token: str


@dataclass(frozen=True)
class Beat:
    """One worker's heartbeat: its host sample and the leases it holds."""

    worker: str
    sample: dict[str, Any]
    held: list[Lease]
    owner: str = ""  # the identity of the token that calls for it (register.lua)


@dataclass
class Claim:
    leases: list[Lease] = field(default_factory=list)
    reason: str = ""  # why nothing (more) was leased: slots, nothing, image, draining, ...


@dataclass(frozen=True)
class Report:
    """One report's part in `LeasesState.report_many`."""

    report_id: str
    job: str
    token: str
    worker: str
    outcome: str
    result: JobResult  # what the job keeps of the report (its `result` field)
    reason: str = ""
    oom: bool = False
    error: tuple[str, ...] = ()  # a task's exception classes, qualified, its own first (its MRO)
    owner: str = ""  # the identity of the token that calls (include/lease_check.lua)


@dataclass(frozen=True)
class Expiry:
    rearmed: bool
    count: int
    lost: list[str]


@dataclass(frozen=True)
class Timings:
    """Durations in milliseconds, as the scripts take them."""

    grace_ms: int
    toleration_ms: int
    max_lost: int = 3

    @classmethod
    def from_executor(cls, ex: Any) -> Timings:
        return cls(int(ex.grace_seconds * 1000), int(ex.toleration_seconds * 1000), ex.max_lost)
