"""Periodic schedules: a cron and the job each of its ticks queues (`piloop schedule add`, `Client.schedule`).

The pass queues a due tick's job once, whatever the number of daemons (state/schedules.py). Cron is UTC, in
croniter's syntax: five fields, or six with seconds last. A tick missed while no daemon ran is queued once (the
first one missed), then the schedule resumes at its first tick after now: never one job per missed tick.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from itertools import pairwise

from croniter import croniter

from piloop_common.errors import BadRequest, NotFound
from piloop_common.protocol.schedule import ScheduleRequest, ScheduleView, check_cron
from piloop_server.runtime import Runtime
from piloop_server.state.schedules import ScheduleRecord

log = logging.getLogger("piloop.schedules")


def next_after(cron: str, after_ms: int) -> int:
    """The cron's first tick strictly after `after_ms` (ms since the epoch, UTC)."""
    start = datetime.fromtimestamp(after_ms / 1000, UTC)
    return int(croniter(cron, start).get_next(float) * 1000)


PERIOD_TICKS = 64  # the ticks check_period looks at


def check_period(cron: str, least_seconds: float, now_ms: int) -> None:
    """BadRequest when two of the cron's next PERIOD_TICKS ticks are closer than `least_seconds`
    ([plugins.state] schedule_min_period_seconds)."""
    it = croniter(cron, datetime.fromtimestamp(now_ms / 1000, UTC))
    ticks = [it.get_next(float) for _ in range(PERIOD_TICKS)]
    closest = min(b - a for a, b in pairwise(ticks))
    if closest < least_seconds:
        raise BadRequest(
            f"--cron {cron!r} fires {closest:g} s apart, more often than [plugins.state] schedule_min_period_seconds "
            f"= {least_seconds:g}"
        )


def add(rt: Runtime, req: ScheduleRequest, by: str) -> ScheduleView:
    from piloop_server import jobs

    check_cron(req.cron)
    check_period(req.cron, rt.settings.plugins.state.schedule_min_period_seconds, rt.schedules.now_ms())
    if req.job.spec.after:
        raise BadRequest("a schedule's job cannot wait on other jobs (--after): each tick's job stands alone")
    jobs.check_submit(rt, req.job)  # the checks a submit makes, now, rather than at every tick
    rec = ScheduleRecord(
        name=req.name,
        cron=req.cron,
        kind=req.job.kind,
        pool=req.job.pool,
        campaign=req.job.campaign,
        image=req.job.image,
        spec=req.job.spec.model_dump_json(),
        by=by,
        created_ms=rt.schedules.now_ms(),
    )
    first = next_after(req.cron, rec.created_ms)
    rt.schedules.add(rec, first)
    return view(ScheduleRecord(**{**rec.__dict__, "next_ms": first}))


def view(rec: ScheduleRecord) -> ScheduleView:
    import json

    return ScheduleView(
        name=rec.name,
        cron=rec.cron,
        next_ms=rec.next_ms,
        kind=rec.kind,
        pool=rec.pool,
        campaign=rec.campaign,
        image=rec.image,
        spec=json.loads(rec.spec),
        by=rec.by,
        created_ms=rec.created_ms,
    )


def listing(rt: Runtime) -> tuple[list[ScheduleView], int]:
    """Every schedule's view, and how many records were skipped as unreadable (each logged)."""
    recs, skipped = rt.schedules.all_counted()
    out = []
    for r in recs:
        try:
            out.append(view(r))
        except (ValueError, TypeError, KeyError) as e:
            skipped += 1
            log.warning("event=record.skipped record=schedule name=%r error=%s", r.name, str(e).splitlines()[0][:200])
    return out, skipped


def remove(rt: Runtime, name: str, by: str) -> None:
    if not rt.schedules.remove(name):
        raise NotFound(f"no schedule {name} (`piloop schedule list`)")
    rt.events.add("schedule.removed", by, schedule=name)
