"""A job dir's record (`job.json`) for tests that make job dirs by hand."""

from __future__ import annotations

from typing import Literal

from piloop_common.protocol.worker import JobSpec
from piloop_worker.jobrecord import JobRecord


def job_record(job: str, token: str = "1", runner: Literal["process", "task"] = "process") -> JobRecord:
    return JobRecord(job=job, token=token, kind="evaluation", pool="cpu", spec=JobSpec(runner=runner, argv=["m:f"]))
