"""What the worker holds of each job it runs: its lease, its slot and generation there, its log shipper, its end
(the supervisor's `Ended`) and its report once it ended."""

from __future__ import annotations

from dataclasses import dataclass

from piloop_common.protocol.report import ReportRequest
from piloop_worker.cgroups import JobCgroup
from piloop_worker.jobrecord import JobRecord
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper
from piloop_worker.slots.wire import Ended


@dataclass
class Held:
    lease: HeldLease
    kind: str
    slot: int  # its slot's number (`slotset.Slots`)
    generation: int  # its name to its slot's supervisor
    shipper: LogShipper
    ended: Ended | None = None  # how it ended, from its supervisor
    report: ReportRequest | None = None
    spooled: bool = False  # its report is in the spool (`reporting.py`, the spool's rule)
    next_try: float = 0.0
    tries: int = 0
    disk_error: bool = False
    cgroup: JobCgroup | None = None  # given back (`Cgroups.give`) once its report is built
    record: JobRecord | None = None  # its assignment, as made at its start or given back by its supervisor

    @property
    def job(self) -> str:
        return self.lease.job

    @property
    def uses_slot(self) -> bool:
        """Whether its slot is still its own: until its report is built (its files collected)."""
        return self.report is None
