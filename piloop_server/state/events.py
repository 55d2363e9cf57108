"""The event stream (who did what) and the inbox of escalations."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records import codec
from piloop_server.state.records.codec import text as _s
from piloop_server.state.scripts import EventCap

INBOX_BATCH = 500  # inbox items read (HSCAN) and removed (HDEL) a call


def _entry(eid: Any, f: dict[Any, Any]) -> dict[str, str]:
    """One stream entry as the API shows it: its fields, and its stream id, which no field overrides."""
    return {**{_s(k): _s(v) for k, v in f.items()}, "id": _s(eid)}


class EventsState:
    def __init__(self, client: redis.Redis, keys: Keys, cap: EventCap | None = None) -> None:
        self.r = client
        self.k = keys
        self.cap = cap or EventCap()

    def add(self, type_: str, by: str, **fields: Any) -> str:
        """Append one event under the same bound as the scripts' (include/events.lua): each value cut past
        `cap.value_bytes`, about `cap.most` kept. `id` is the stream's own: no event field takes its name."""
        if "id" in fields:
            raise ValueError(f"event {type_}: a field named id would hide the event's stream id; name it apart")
        data = {"type": type_, "by": by, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}}
        data = {k: self._cut(v) for k, v in data.items()}
        return _s(self.r.xadd(self.k.events(), codec.fields(data), maxlen=self.cap.most, approximate=True))

    def _cut(self, v: str) -> str:
        raw = v.encode()
        if len(raw) <= self.cap.value_bytes:
            return v
        return raw[: self.cap.value_bytes].decode(errors="ignore") + "..."

    def read(self, after: str = "0", count: int = 100, block_ms: int | None = None) -> list[dict[str, str]]:
        entries: Any
        if block_ms:
            got: Any = self.r.xread(  # RESP2: [[stream, entries]]; redis-py types RESP3's dict
                {self.k.events(): after}, count=count, block=block_ms
            )
            entries = got[0][1] if got else []
        else:
            entries = self.r.xrange(self.k.events(), min=f"({after}" if after != "0" else "-", count=count)
        return [_entry(eid, f) for eid, f in entries]

    def tail(self, count: int) -> list[dict[str, str]]:
        entries: Any = self.r.xrevrange(self.k.events(), count=count)
        return [_entry(eid, f) for eid, f in reversed(entries)]

    def escalate(self, what: str, message: str, **fields: Any) -> str:
        """An escalation: something an operator must look at, kept in the inbox until acknowledged (and then for
        `events_seconds`, `prune_inbox`). A flood past `cap.inbox_most` (and a tenth) is cut back here at once."""
        eid = uuid.uuid4().hex[:12]
        rec = {"id": eid, "what": what, "message": message, "at_ms": int(time.time() * 1000), "acked": False, **fields}
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.k.inbox(), eid, json.dumps(rec))
        pipe.hlen(self.k.inbox())
        held = int(pipe.execute()[1])
        self.add("escalation", "service:daemon", what=what, message=message, escalation=eid)
        if held > self.cap.inbox_most + self.cap.inbox_most // 10:
            self.prune_inbox(None)
        return eid

    def inbox(self, include_acked: bool = False) -> list[dict[str, Any]]:
        recs = [json.loads(v) for v in self.r.hvals(self.k.inbox())]
        return sorted((r for r in recs if include_acked or not r["acked"]), key=lambda r: r["at_ms"])

    def ack(self, eid: str, by: str) -> bool:
        raw = self.r.hget(self.k.inbox(), eid)
        if raw is None:
            return False
        rec = json.loads(raw)
        if not rec.get("acked"):  # the first acknowledgement is the one retention counts from
            rec.update(acked=True, acked_by=by, acked_ms=int(time.time() * 1000))
        self.r.hset(self.k.inbox(), eid, json.dumps(rec))
        return True

    def prune_inbox(self, acked_ms: int | None, batch: int = INBOX_BATCH) -> InboxPruned:
        """Remove the items acknowledged longer than `acked_ms` ago (None: none by age), then, past `cap.inbox_most`,
        the oldest acknowledged ones and then the oldest. Read and removed `batch` at a time; the inbox is itself
        bounded, so one call reads at most about `inbox_most` items. Two daemons at once remove the same items."""
        now = int(time.time() * 1000)
        expired: list[str] = []
        rest: list[tuple[bool, int, str]] = []  # (unacknowledged, at_ms, id): acknowledged and older sort first
        cursor = 0
        while True:
            got: Any = self.r.hscan(self.k.inbox(), cursor, count=batch)  # (cursor, {field: value})
            cursor, chunk = got
            for raw_id, raw in chunk.items():
                eid = _s(raw_id)
                try:
                    rec = json.loads(raw)
                    at, acked = int(rec.get("at_ms", 0)), bool(rec.get("acked"))
                    when = int(rec.get("acked_ms", at))  # acknowledged before acked_ms was kept: by when it was raised
                except (ValueError, TypeError, AttributeError):
                    at, acked, when = 0, True, 0  # not a record piloop wrote: the first to go
                if acked and acked_ms is not None and now - when > acked_ms:
                    expired.append(eid)
                else:
                    rest.append((not acked, at, eid))
            if not cursor:
                break
        over = max(0, len(rest) - self.cap.inbox_most)
        capped = [eid for _, _, eid in sorted(rest)[:over]]
        for doomed in (expired, capped):
            for i in range(0, len(doomed), batch):
                self.r.hdel(self.k.inbox(), *doomed[i : i + batch])
        return InboxPruned(len(expired), len(capped))


@dataclass(frozen=True)
class InboxPruned:
    acked: int  # acknowledged items past their age
    over_cap: int  # items past `inbox_max`, the oldest acknowledged ones first
