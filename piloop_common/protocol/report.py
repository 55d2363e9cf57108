"""The messages of a worker's reports and log appends: a job's end (`ReportRequest`), several of them with the
next claim in one call (`ReportsRequest`), and the chunks of a running job's log (`LogAppend`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from piloop_common.exceptionnames import CLASSES_MOST, EXCEPTION_NAME
from piloop_common.protocol.worker import (
    LOG_CHUNKS_PER_CALL,
    Address,
    ClaimRequest,
    ClaimResponse,
    JobId,
    LeaseToken,
    Message,
    Outcome,
    ReportId,
    check_inline,
)


class Usage(Message):
    peak_rss_bytes: int = 0
    cpu_seconds: float = 0.0


class ReportRequest(Message):
    protocol: int
    report_id: ReportId
    job: JobId
    token: LeaseToken
    outcome: Outcome
    exit_code: int | None = None
    signal: int | None = None
    oom: bool = False
    reason: str = Field("", max_length=2000)
    usage: Usage = Field(default_factory=Usage)
    log: list[Address] = Field(default_factory=list, description="CAS addresses of the log's chunks, in order.")
    outputs: dict[str, Address] = Field(default_factory=dict, description="Output name -> CAS address.")
    inline_outputs: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Output name -> its bytes, base64: a task's small result (`result.json`, `result.pickle`) carried in the "
            "report and kept with the job, never put in the CAS; at most 64 KiB in all, decoded "
            "(`piloop_common.bytecaps.INLINE_MAX_BYTES`), and no name of `outputs`."
        ),
    )
    metrics: Address | None = Field(None, description="CAS address of metrics.jsonl.")
    duration_seconds: float = 0.0
    head: str = Field(
        "", pattern=r"^([0-9a-f]{40})?$", description="Agents of a campaign: the commit their clone ended at."
    )
    bundle: Address | None = Field(None, description="Agents: CAS address of a bundle of their new commits.")
    workspace: Address | None = Field(
        None, description="Agents: CAS address of their workspace writes (path -> address or null)."
    )
    score: float | None = Field(None, description="Evaluations of a campaign: the score the eval command printed.")
    fetched_bytes: int = Field(0, ge=0, description="Bytes of repo bundles the worker fetched for this job.")
    error: list[Annotated[str, Field(pattern=EXCEPTION_NAME)]] = Field(
        default_factory=list,
        max_length=CLASSES_MOST,
        description=(
            "Tasks that raised: the exception's classes, qualified, its own first then its bases (its MRO), for the "
            "server's `retry_on` decision."
        ),
    )

    @model_validator(mode="after")
    def _inline(self) -> ReportRequest:
        if self.inline_outputs:
            check_inline(self.inline_outputs, self.outputs, "output")
        return self


class ReportResponse(Message):
    answer: Literal["accepted", "stale"]
    state: str | None = None


REPORTS_PER_CALL = 64


class ReportsRequest(Message):
    """Several reports in one call (a worker's jobs that ended together): one HTTP call, one token check, one CAS
    lookup for all the blobs they name. Each is still its own report, answered on its own."""

    protocol: int
    reports: list[ReportRequest] = Field(min_length=1, max_length=REPORTS_PER_CALL)
    claim: ClaimRequest | None = Field(
        None,
        description=(
            "A claim made after the reports, in the same call (the slots they free are free for it); it never waits "
            "(`wait_seconds` is not heeded)."
        ),
    )


class ReportAnswer(Message):
    """One report's answer in a `ReportsResponse`: `answer` (and `state`), or the error that refused it alone."""

    answer: Literal["accepted", "stale"] | None = None
    state: str | None = None
    error: str | None = Field(None, description="The error's code, where this report was refused (bad_request, ...).")
    message: str = ""


class ReportsResponse(Message):
    answers: list[ReportAnswer] = Field(description="One per report, in the order sent.")
    claim: ClaimResponse | None = Field(
        None,
        description=(
            "The answer to the request's claim; none when it had none or the claim failed (the worker claims alone "
            "next, and hears why)."
        ),
    )


class LogAppend(Message):
    protocol: int
    job: JobId
    token: LeaseToken
    chunks: list[Address] = Field(
        min_length=1, max_length=LOG_CHUNKS_PER_CALL, description="CAS addresses of new log chunks, in order."
    )


class LogAnswer(Message):
    dropped: int = Field(
        0,
        description="Chunks of this call past the job's caps ([plugins.state] log_chunks_max, log_max_bytes), not kept.",
    )
