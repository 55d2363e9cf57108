"""What the worker holds of each job it runs: its lease, its dir, its log shipper, its report once it ended."""

from __future__ import annotations

from dataclasses import dataclass

from piloop_common.protocol.report import ReportRequest
from piloop_worker.cgroups import JobCgroup
from piloop_worker.jobdir import JobDir
from piloop_worker.jobrecord import JobRecord
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper


@dataclass
class Held:
    lease: HeldLease
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

    @property
    def job(self) -> str:
        return self.lease.job
