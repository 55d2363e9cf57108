"""Re-attach: the slots an earlier worker on this `--dir` left, found again at start (`find_held`) and their jobs held
again (`reattach`).

Each slot's supervisor is connected (one that died is started again, and reads the ends it kept in `ended.json`): the
job it holds is held again (the server says whether its lease still is, `fencing.apply_statuses`), and each end no
worker acknowledged is reported like any other.
"""

from __future__ import annotations

import logging
from pathlib import Path

from piloop_common.errors import Unavailable
from piloop_common.protocol.worker import LeaseStatus, Timing
from piloop_worker.cgroups import Cgroups, JobCgroup
from piloop_worker.fencing import apply_answer
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobrecord import BadJobRecord, JobRecord
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper
from piloop_worker.records import ExitRecord
from piloop_worker.relay import Relay
from piloop_worker.slots.wire import Ended
from piloop_worker.slotset import Slots

log = logging.getLogger("piloop.worker")


def _record(raw: dict[str, object] | None, slot: int) -> JobRecord | None:
    if raw is None:
        return None
    try:
        return JobRecord.from_dict(raw, f"slot {slot}'s record")
    except BadJobRecord as e:
        log.warning("event=slot.bad_record slot=%d error=%s", slot, e)
        return None


def find_held(slots: Slots, cgroups: Cgroups) -> list[Held]:
    """The jobs the slots' supervisors hold, and the ends they kept: to hold again, and to report."""
    out: list[Held] = []
    for n in slots.existing():
        orphan = slots.orphaned(n)
        try:
            state = slots.open(n)
        except Unavailable as err:
            log.warning("event=slot.unavailable slot=%d error=%s", n, err.message)
            continue
        sd = slots.dir(n)
        for e in state.ended:
            if not e.job:
                slots.ack(n, e.generation)
                continue
            rec = _record(e.record, n)
            shipper = LogShipper(sd.output_log, sd.root / "log.json", resume=True)
            out.append(
                Held(HeldLease(e.job, e.token), rec.kind if rec else "", n, e.generation, shipper, e, record=rec)
            )
        known = {e.generation for e in state.ended} | ({state.holding.generation} if state.holding else set())
        if orphan is not None and orphan.generation not in known:
            # its supervisor died with the worker before, and its end with them: lost (its processes died with it)
            lost = Ended(
                orphan.generation, ExitRecord(lost=True, reason="the slot's supervisor died before the job ended")
            )
            shipper = LogShipper(sd.output_log, sd.root / "log.json", resume=True)
            out.append(Held(HeldLease(orphan.job, orphan.token), "", n, orphan.generation, shipper, lost))
        held = state.holding
        if held is not None:
            rec = _record(held.record, n)
            cg = JobCgroup(Path(held.cgroup), cgroups.version) if held.cgroup and cgroups.available else None
            shipper = LogShipper(sd.output_log, sd.root / "log.json", resume=True)
            lease = HeldLease(held.job, held.token)
            out.append(Held(lease, rec.kind if rec else "", n, held.generation, shipper, cgroup=cg, record=rec))
    return out


def reattach(
    found: list[Held],
    statuses: dict[str, LeaseStatus],
    sent: float,
    *,
    holdings: Holdings,
    slots: Slots,
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
    apply_answer(slots, holdings, statuses, sent, found, timing, worker)
    for h in found:
        st = statuses.get(h.job, LeaseStatus.LOST)
        if st is LeaseStatus.OK and h.ended is None:
            sd = slots.dir(h.slot)
            relay_at = Path(h.record.relay) if h.record and h.record.relay else relay.path_for(sd.root)
            relay.add_or_say(h.lease, relay_at, sd.output_log)
        log.info("event=job.reattached job=%s token=%s status=%s slot=%d", *h.lease, st.value, h.slot)
