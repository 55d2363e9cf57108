"""The messages of a worker's calls, as pydantic models used on both sides. What every message shares (`Message`,
the id patterns) is in `message`, a job's spec in `spec`, reports and log appends in `report`, the operator's in
`operator`, the campaigns' in `campaign`, the schedules' in `schedule`.

`PROTOCOL` is checked at every worker call: a worker speaking another one is refused.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from piloop_common.bytecaps import LOG_MAX_BYTES, RESULT_MAX_BYTES

# re-exported: what every message shares, and the job's spec, are imported from here too
from piloop_common.protocol.message import JOB_ID as JOB_ID
from piloop_common.protocol.message import LEASE_TOKEN as LEASE_TOKEN
from piloop_common.protocol.message import Address as Address
from piloop_common.protocol.message import JobId as JobId
from piloop_common.protocol.message import LeaseToken as LeaseToken
from piloop_common.protocol.message import Message as Message
from piloop_common.protocol.message import ReportId as ReportId
from piloop_common.protocol.message import text_problem as text_problem
from piloop_common.protocol.spec import AFTER_MOST as AFTER_MOST
from piloop_common.protocol.spec import COUNTDOWN_MOST as COUNTDOWN_MOST
from piloop_common.protocol.spec import INLINE_PREFIX as INLINE_PREFIX
from piloop_common.protocol.spec import JOB_ENV_RESERVED as JOB_ENV_RESERVED
from piloop_common.protocol.spec import MEMORY_MOST_MB as MEMORY_MOST_MB
from piloop_common.protocol.spec import PIPE_INPUTS as PIPE_INPUTS
from piloop_common.protocol.spec import PIPE_PLACEHOLDER as PIPE_PLACEHOLDER
from piloop_common.protocol.spec import TIMEOUT_MOST as TIMEOUT_MOST
from piloop_common.protocol.spec import CampaignJob as CampaignJob
from piloop_common.protocol.spec import JobSpec as JobSpec
from piloop_common.protocol.spec import RepoSpec as RepoSpec
from piloop_common.protocol.spec import check_inline as check_inline
from piloop_common.protocol.spec import input_problem as input_problem

# 2: a task's small arguments and value inline (spec.inline_inputs, a report's inline_outputs), a report's
# answer kept with its job; a worker of 1 would drop what 2 sends inline
PROTOCOL = 2
API = "/v1"
# A job's relay (on its worker) names the job and its lease on every call it forwards.
RELAY_JOB_HEADER = "x-piloop-job"
RELAY_TOKEN_HEADER = "x-piloop-lease-token"
RELAY_MARKER_HEADER = "x-piloop-relayed"  # set by a worker's relay on what it forwards: relay routes only
# a listing's count of the records it skipped because they cannot be read (each one logged by the server)
SKIPPED_HEADER = "x-piloop-skipped"

Kind = Literal["agent", "evaluation"]
Outcome = Literal["succeeded", "failed", "cancelled", "fenced", "lost"]
JobState = Literal[
    "waiting", "queued", "leased", "running", "succeeded", "failed", "cancelled", "lost", "worker_lost", "expired"
]
TERMINAL_STATES = ("succeeded", "failed", "cancelled", "lost", "worker_lost", "expired")


HELD_MOST = 1024  # the jobs one heartbeat may name
WANT_MOST = 100_000  # the most a claim may name for a kind whatever the config ([plugins.state] claim_want_max)
LOG_CHUNKS_PER_CALL = 256  # a log append's chunks (the worker sends a few every few seconds)


# --- the worker's calls ------------------------------------------------------------------


class HostSample(Message):
    cpus: int = Field(ge=1)
    load1: float = Field(ge=0, description="The 1-minute load average of the host.")
    memory_available_gb: float = Field(ge=0)
    disk_free_gb: float = Field(ge=0)
    memory_pressure: float | None = Field(None, description="PSI `some avg10` (%), where the host has it.")

    @property
    def load_per_cpu(self) -> float:
        return self.load1 / self.cpus


class HeldJob(Message):
    job: JobId
    token: LeaseToken


class WorkerHello(Message):
    """What registration and every heartbeat carry."""

    protocol: int
    pool: str
    image: str = ""
    cas_id: str
    sample: HostSample
    jobs: list[HeldJob] = Field(default_factory=list, max_length=HELD_MOST)
    admission: str = Field("", max_length=64, description="Why the worker itself claims nothing now (e.g. `memory`).")


class RegisterRequest(WorkerHello):
    name: str | None = Field(None, description="Only where the token allows naming the worker.")
    info: dict[str, Any] = Field(default_factory=dict, description="host, pid, version, cgroups")


class Timing(Message):
    renew_seconds: float
    grace_seconds: float
    toleration_seconds: float
    request_timeout_seconds: float
    kill_grace_seconds: float
    memory_pressure_max: float
    memory_reserve_mb: int = Field(
        0, description="The pool's memory reserve: the worker's room is its available memory less this."
    )
    memory_held_seconds: float = Field(
        60, description="A job held at its memory limit this long is stopped, out of memory."
    )
    log_max_bytes: int = Field(
        LOG_MAX_BYTES,
        description="[plugins.state] log_max_bytes: the worker ships no more of a job's log, then a marker.",
    )
    result_max_bytes: int = Field(
        RESULT_MAX_BYTES, description="[plugins.state] result_max_bytes: a task's result over it fails the task."
    )


class LeaseStatus(StrEnum):
    """The server's word on a lease a worker named: renew it, stop its job (cancelled), or stop it (not the worker's
    lease any more). A word this side does not know is `lost`: the safe side."""

    OK = "ok"
    CANCEL = "cancel"
    LOST = "lost"


def _lease_statuses(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    known = {s.value for s in LeaseStatus}
    return {job: word if word in known else LeaseStatus.LOST.value for job, word in data.items()}


LeaseStatuses = Annotated[
    dict[str, LeaseStatus],
    BeforeValidator(_lease_statuses),
    Field(default_factory=dict, description="job -> ok | cancel | lost"),
]


class RegisterResponse(Message):
    worker: str
    timing: Timing
    jobs: LeaseStatuses


class HeartbeatResponse(Message):
    jobs: LeaseStatuses
    timing: Timing | None = Field(
        None,
        description=(
            "The timings this renewal was made under: the worker fences by them from this answer on, so a server "
            "restarted with other timings is never one the worker disagrees with (None: an older server)."
        ),
    )


class ClaimRequest(Message):
    protocol: int
    want: dict[Kind, Annotated[int, Field(ge=0, le=WANT_MOST)]] = Field(
        description="How many jobs of each kind the worker has room for now ([plugins.state] claim_want_max caps it)."
    )
    wait_seconds: float = Field(0, ge=0, le=60, description="With nothing to lease, wait up to this long for a job.")
    room_mb: int | None = Field(
        None,
        ge=0,
        description=(
            "The memory (MiB) this worker can grant: its available memory less the pool's reserve. A job is leased only "
            "when its grant fits beside the grants the worker holds; none: grants are not checked."
        ),
    )


class Assignment(Message):
    job: str
    token: str
    kind: Kind
    pool: str
    campaign: str = ""
    image: str = ""
    spec: JobSpec
    secrets: dict[str, str] = Field(default_factory=dict, description="Values of the secrets the job names.")
    memory_mb: int | None = Field(
        None,
        description="This attempt's grant (MiB), raised after an out-of-memory "
        "attempt; none: limited to the worker's room.",
    )


class ClaimResponse(Message):
    leases: list[Assignment] = Field(default_factory=list)
    reason: str = Field("", description="Why no (more) lease was given: slots, load, memory, nothing, ...")
    timing: Timing | None = Field(None, description="The timings the leases were granted under (with leases only).")


class ReleaseRequest(Message):
    protocol: int
    job: JobId
    token: LeaseToken
    reason: str = Field("", max_length=500)
