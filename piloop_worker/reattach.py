"""Re-attach: the job dirs an earlier worker on this `--dir` left, found again at start (`find_held`) and held again
(`reattach`).

A live shim's job is held again (the server says whether its lease still is, `fencing.apply_statuses`); a job whose
shim died with no exit record is buried; an ended job is reported like any other.
"""

from __future__ import annotations

import logging
from pathlib import Path

from piloop_common.protocol.worker import LeaseStatus, Timing
from piloop_worker.cgroups import Cgroups
from piloop_worker.fencing import apply_answer, bury, cgroup_of
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobdir import scan
from piloop_worker.jobrecord import BadJobRecord
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper
from piloop_worker.relay import Relay, socket_path

log = logging.getLogger("piloop.worker")


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


def reattach(
    found: list[Held],
    statuses: dict[str, LeaseStatus],
    sent: float,
    *,
    holdings: Holdings,
    cgroups: Cgroups,
    relay: Relay,
    timing: Timing,
    worker: str,
) -> None:
    """Hold again the jobs `found`, as the server's `statuses` of them (named in a call sent at `sent`) say: a live
    lease's job gets its deadline and its relay again, any other is stopped."""
    # the groups of jobs an earlier worker reported, or left ended: the jobs found keep theirs until reported
    swept = cgroups.sweep({h.cgroup.path for h in found if h.cgroup is not None})
    if swept:
        log.info("event=worker.cgroups_removed worker=%s count=%d (left by an earlier worker)", worker, len(swept))
    for h in found:
        holdings.add(h)
    apply_answer(holdings, statuses, sent, found, timing, worker)
    for h in found:
        st = statuses.get(h.job, LeaseStatus.LOST)
        if st is LeaseStatus.OK and not h.jd.exit_json.exists():
            relay_at = Path(h.record.relay) if h.record and h.record.relay else socket_path(h.jd.root)
            relay.add_or_say(h.lease, relay_at, h.jd.output_log)
        log.info("event=job.reattached job=%s token=%s status=%s", *h.lease, st.value)
