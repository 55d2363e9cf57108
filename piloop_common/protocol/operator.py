"""The messages of the operator's calls (the CLI and the Python client): submitting and reading jobs, workers,
limits and tokens; and an agent's own submissions through its relay."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from piloop_common.protocol.worker import HostSample, JobId, JobSpec, Kind, Message


class SubmitRequest(Message):
    kind: Kind = "evaluation"
    pool: str = "serve"
    campaign: str = Field("", max_length=200)
    image: str = Field("", max_length=1024)
    spec: JobSpec
    id: JobId | None = Field(
        None, description="The job's id, chosen by the caller (Celery's task_id); none: a new one."
    )


class SubmitResponse(Message):
    job: str


RELAY_COMMIT = r"^[0-9a-f]{7,40}$"


class RelaySubmit(Message):
    """`piloop job submit` inside a campaign's agent: the campaign's evaluation of one commit of its repo.

    The agent names the commit only; the server builds the rest (kind, pool, command, image, env, secrets, inputs,
    scoring) from the campaign record that the agent's lease points to."""

    commit: str = Field(
        pattern=RELAY_COMMIT,
        description=(
            "A commit of the campaign's repo on the server: its sha, or a prefix of it (7 to 40 lowercase hex digits)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _commit_only(cls, data: Any) -> Any:
        extra = sorted(set(data) - {"commit"}) if isinstance(data, dict) else []
        if extra:
            raise ValueError(
                f"{', '.join(extra)}: an agent names only the commit to evaluate; its campaign sets "
                "the pool, command, image, env, secrets, inputs and scoring"
            )
        commit = data.get("commit") if isinstance(data, dict) else None
        if isinstance(commit, str) and not re.fullmatch(RELAY_COMMIT, commit):
            raise ValueError(f"commit {commit[:80]!r}: not a commit's sha (7 to 40 lowercase hex digits)")
        return data


class JobUsage(Message):
    model_config = ConfigDict(extra="allow")
    peak_rss_bytes: int = 0
    cpu_seconds: float = 0.0


class JobResult(Message):
    """What a job's last report said (empty until one did): `view.result.exit_code`, `.outputs["result.json"]`."""

    model_config = ConfigDict(extra="allow")  # a key a newer server adds stays readable, never refused
    exit_code: int | None = None
    signal: int | None = None
    oom: bool = False
    outcome: str = Field("", description="The worker's outcome (succeeded, failed, cancelled, fenced, lost).")
    usage: JobUsage = Field(default_factory=JobUsage)
    log: list[str] = Field(default_factory=list, description="CAS addresses of the log's chunks, in order.")
    log_dropped: int = 0
    log_truncated: int = 0
    outputs: dict[str, str] = Field(default_factory=dict, description="Output name -> CAS address.")
    inline_outputs: dict[str, str] = Field(
        default_factory=dict, description="Output name -> its bytes, base64: a task's small result, kept here."
    )
    metrics: str | None = None
    duration_seconds: float = 0.0
    at_ms: int = Field(0, description="When the server took the report (ms).")
    fetched_bytes: int = 0
    head: str = ""
    bundle: str | None = None
    workspace: str | None = None
    score: float | None = None
    error: list[str] = Field(default_factory=list, description="The exception's class names, most derived first.")

    def __bool__(self) -> bool:
        """False until a report said something (a job never leased has no result)."""
        return bool(self.model_fields_set or self.model_extra)

    @model_serializer(mode="wrap")
    def _as_stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # on the wire, the keys the report gave and no default (a job not reported yet: `{}`)
        data = handler(self)
        return {k: v for k, v in data.items() if k in self.model_fields_set or k in (self.model_extra or {})}


class JobView(Message):
    id: str
    kind: str
    pool: str
    campaign: str = ""
    image: str = ""
    state: str
    attempts: int = 0
    lost: int = 0
    worker: str = ""
    token: str = Field(
        "", description="The lease's fencing order (its token's random part is its holder's alone, never shown)."
    )
    created_ms: int = 0
    updated_ms: int = 0
    started_ms: int = Field(
        0, description="When its latest attempt started running, or was leased when it ended first (0: neither)."
    )
    finished_ms: int = Field(0, description="When it ended (0: it has not).")
    reason: str = ""
    spec: dict[str, Any] = Field(default_factory=dict)
    result: JobResult = Field(default_factory=JobResult)
    log: list[str] = Field(default_factory=list)
    log_dropped: int = Field(
        0, description="Log chunks not kept, past [plugins.state] log_chunks_max or log_max_bytes."
    )
    log_truncated: int = Field(
        0, description="The log was cut at this many bytes ([plugins.state] log_max_bytes); 0: it is whole."
    )
    progress: list[dict[str, Any]] = Field(default_factory=list, description="The job's own notes: note, by, at_ms.")
    memory_mb: int = Field(0, description="The grant (MiB) of the job's current or next attempt; 0: none of its own.")
    retry_ms: int = Field(0, description="A failed job waiting to be tried again: when it goes back to the queue.")
    not_before_ms: int = Field(
        0, description="A job queued with a countdown: when it becomes claimable (Redis's clock)."
    )
    expires_ms: int = Field(0, description="A job queued with an expiry, not started yet: when it ends `expired`.")
    waiting: str = Field(
        "",
        description="Why a queued job has no lease, where the live workers of its pool tell (none "
        "is live, none runs its image, its grant exceeds every one's room); "
        "`job show` only.",
    )


class ProgressNote(Message):
    """`piloop progress "note"` inside a job, through its worker's relay."""

    note: str = Field(min_length=1, max_length=2000)


class WorkerView(Message):
    name: str
    pool: str
    image: str = ""
    host: str = Field("", description="The host name the worker registered with.")
    seen_seconds: float | None = None
    reachable: bool
    draining: bool = False
    sample: HostSample | None = None
    agents: int = 0
    evaluations: int = 0
    no_lease: str = ""
    room_mb: int | None = Field(None, description="The memory (MiB) the worker can grant, as its last claim said.")
    granted_mb: int = Field(0, description="The memory (MiB) granted to the jobs it holds.")


class LimitRequest(Message):
    key: str
    value: Any
    reason: str = Field(min_length=1)


class LimitView(Message):
    key: str
    value: Any
    reason: str
    by: str
    at_ms: int


TokenRole = Literal["viewer", "operator", "admin"]


class TokenCreate(Message):
    name: str = Field(description="Checked by piloop_common.names.check_name, the one name rule.")
    pool: str | None = None
    expires_seconds: float | None = Field(None, gt=0)
    rename: bool = Field(False, description="The worker may choose its own name with --name.")
    role: TokenRole | None = Field(
        None, description="A person's or a program's token with this role; none: a worker's."
    )


class TokenView(Message):
    name: str
    pool: str | None = None
    created_ms: int
    expires_ms: int | None = None
    by: str
    revoked: bool = False
    rename: bool = False
    role: TokenRole | None = None


class TokenCreated(Message):
    name: str
    token: str
