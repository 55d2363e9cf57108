"""What the worker holds of each job it runs: its lease, its dir, its log shipper, its report once it ended."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from piloop_common.protocol.report import ReportRequest
from piloop_worker.cgroups import JobCgroup
from piloop_worker.jobdir import JobDir
from piloop_worker.jobrecord import JobRecord
from piloop_worker.logs import LogShipper

REPORT_NS = uuid.UUID("5d1b7c3e-8f0a-4e4b-9c55-7a1f0c2d9e61")


def report_id_for(job: str, token: str) -> str:
    """One report id per lease, so a report rebuilt after a crash is the same report to the server."""
    return str(uuid.uuid5(REPORT_NS, f"{job}/{token}"))


@dataclass
class Held:
    job: str
    token: str
    kind: str
    jd: JobDir
    shipper: LogShipper
    # when its shim must hold the dir's lock by: a shim gone after it is found at once, a fresh job's or a
    # re-attached one's alike (0.0: a re-attached job's shim held it long ago)
    shim_due: float = 0.0
    report: ReportRequest | None = None
    next_try: float = 0.0
    tries: int = 0
    disk_error: bool = False
    cgroup: JobCgroup | None = None  # given back (`Cgroups.give`) with its dir, once the job is reported
    record: JobRecord | None = None  # its job.json, as written at its start or read at re-attach
