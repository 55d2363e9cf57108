"""Re-attach: the job dirs an earlier worker on this `--dir` left, found again at start.

A live shim's job is held again (the server says whether its lease still is, `fencing.apply_statuses`); a job whose
shim died with no exit record is buried; an ended job is reported like any other.
"""

from __future__ import annotations

from pathlib import Path

from piloop_worker.cgroups import Cgroups
from piloop_worker.fencing import bury, cgroup_of
from piloop_worker.held import Held
from piloop_worker.jobdir import scan
from piloop_worker.jobrecord import BadJobRecord
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper


def find_held(workdir: Path, cgroups: Cgroups) -> list[Held]:
    """Job dirs left by an earlier worker: live shims to re-attach, ended jobs to report."""
    out = []
    for jd in scan(workdir):
        try:
            rec = jd.record()
        except BadJobRecord:
            rec = None
        if rec is None:
            jd.remove()  # died before its lease was written down
            continue
        if not jd.shim_alive() and not jd.exit_json.exists():
            bury(jd, cgroups)
        out.append(
            Held(
                HeldLease(rec.job, rec.token),
                rec.kind,
                jd,
                LogShipper(jd),
                cgroup=cgroup_of(cgroups, jd.shim_record()),
                record=rec,
            )
        )
    return out
