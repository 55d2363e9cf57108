"""Periodic schedules: their records, and the pass's step that queues each due tick's job once.

A schedule is a record (its cron and the job to queue, JSON) and its next tick in a sorted set. Cron is computed in
Python (`piloop_server.schedules`, croniter), never in Lua: the pass reads the due ticks and computes each one's
next, and `schedule_tick.lua` queues the job and advances the tick only while the tick is still the one read, so two
daemons (or a pass retried) queue one job a tick, whose id (name and tick) is the same whoever computes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.scripts import EventCap, Fence, Scripts

TICK_BATCH = 200  # due schedules one pass queues (the rest, the next pass)
UNREADABLE = (ValueError, KeyError, TypeError, OverflowError)  # a record, or its cron, this version cannot read
log = logging.getLogger("piloop.schedules")


@dataclass(frozen=True)
class ScheduleRecord:
    """A schedule as Redis keeps it: the job it queues each tick is `kind`, `pool`, ... and `spec` (JSON text)."""

    name: str
    cron: str
    kind: str
    pool: str
    spec: str
    by: str
    created_ms: int
    campaign: str = ""
    image: str = ""
    next_ms: int | None = None  # from the ticks (not stored in the record)

    def to_json(self) -> str:
        d = {k: v for k, v in self.__dict__.items() if k != "next_ms"}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str, next_ms: int | None) -> ScheduleRecord:
        d: dict[str, Any] = json.loads(raw)
        return cls(next_ms=next_ms, **d)

    def job_id(self, tick_ms: int) -> str:
        """The job of one tick: the same id whoever computes it (a second daemon finds it taken)."""
        return f"{self.name}.{tick_ms // 1000}"


class SchedulesState:
    def __init__(self, client: redis.Redis, keys: Keys, cap: EventCap | None = None) -> None:
        self.r = client
        self.k = keys
        self.scripts = Scripts(client, cap)

    def now_ms(self) -> int:
        """Redis's clock (ms): every tick is timed by it, as the scripts are."""
        sec, usec = self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    def add(self, rec: ScheduleRecord, first_ms: int) -> None:
        """Store `rec` with its first tick; Conflict when a schedule has its name."""
        k = self.k
        self.scripts.run(
            "schedule_add", [k.schedules(), k.schedule_ticks(), k.events()], [rec.name, rec.to_json(), first_ms, rec.by]
        )

    def remove(self, name: str) -> bool:
        """Forget schedule `name` (its queued jobs stay); whether it was there."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hdel(self.k.schedules(), name)
        pipe.zrem(self.k.schedule_ticks(), name)
        return bool(pipe.execute()[0])

    def all(self) -> list[ScheduleRecord]:
        """Every schedule that can be read, by name."""
        return self.all_counted()[0]

    def all_counted(self) -> tuple[list[ScheduleRecord], int]:
        """Every schedule by name, and how many records were skipped as unreadable (each logged)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(self.k.schedules())
        pipe.zrange(self.k.schedule_ticks(), 0, -1, withscores=True)
        recs, ticks = pipe.execute()
        at = {_s(n): int(s) for n, s in ticks}
        out, skipped = [], 0
        for name, raw in recs.items():
            try:
                out.append(ScheduleRecord.from_json(_s(raw), at.get(_s(name))))
            except UNREADABLE as e:
                skipped += 1
                log.warning("event=record.skipped record=schedule name=%r error=%s", _s(name), e)
        return sorted(out, key=lambda r: r.name), skipped

    def tick(self, next_after: Callable[[str, int], int], fence: Fence | None = None) -> int:
        """Queue the job of each schedule whose tick has come (Redis's clock), once; how many were queued.
        `next_after(cron, ms)` is the cron's first tick after `ms`: a schedule that missed ticks (no daemon ran)
        queues one job, for the first tick it missed, and resumes at the first tick after now."""
        k = self.k
        now = self.now_ms()
        got: Any = self.r.zrangebyscore(k.schedule_ticks(), "-inf", now, start=0, num=TICK_BATCH, withscores=True)
        due: list[tuple[Any, float]] = list(got)
        if not due:
            return 0
        names = [_s(n) for n, _ in due]
        raws = self.r.hmget(k.schedules(), names)
        args: list[Any] = [k.prefix()]
        for (_, score), raw in zip(due, raws, strict=True):
            if raw is None:
                continue
            tick_ms = int(score)
            try:
                rec = ScheduleRecord.from_json(_s(raw), tick_ms)
                args += [rec.name, tick_ms, next_after(rec.cron, max(now, tick_ms)), rec.job_id(tick_ms)]
            except UNREADABLE as e:  # one bad record never stops the others' ticks, nor the pass
                log.warning("event=record.skipped record=schedule error=%s", e)
        if len(args) == 1:
            return 0
        keys = [k.schedules(), k.schedule_ticks(), k.jobs(), k.events(), k.delayed(), k.expiring()]
        return len(self.scripts.run("schedule_tick", keys, args, fence))
