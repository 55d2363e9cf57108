"""Counters of what the event stream says happened: lease expiries, requeues, stale and foreign-token calls, the
provisioner's starts, refusals and backoffs. The pass and the background workers (other processes) write these
events, so the stream is where one API process sees them all; each scrape reads the events since the last."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime

BATCH = 10_000  # events read a round trip
EXPIRED_THEN = ("queued", "lost", "worker_lost", "cancelled")


class EventCounts(Collector):
    """Counts since this process started: its cursor begins at its start (a stream id is a time in ms), and every
    scrape reads on from where the last stopped. Events the stream trimmed before a scrape read them are missed
    (it keeps `[plugins.state] events_max`), so a counter may undercount, never count twice."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.cursor = str(int(time.time() * 1000))
        self.lock = threading.Lock()  # two scrapes at once read each event once
        self.expired: Counter[str] = Counter()
        self.requeued: Counter[str] = Counter()
        self.stale = self.foreign = 0
        self.started: Counter[str] = Counter()
        self.backoffs: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()

    def _pool(self, name: str) -> str:
        return name if name in self.rt.executor.pools else "other"

    def advance(self) -> None:
        """Count the events written since the last call."""
        with self.lock:
            while True:
                got = self.rt.events.read(self.cursor, BATCH)
                for ev in got:
                    self._count(ev)
                if got:
                    self.cursor = got[-1]["id"]
                if len(got) < BATCH:
                    return

    def _count(self, ev: dict[str, str]) -> None:
        kind = ev.get("type", "")
        if kind == "lease.expired":
            then = ev.get("then", "")
            self.expired[then if then in EXPIRED_THEN else "other"] += 1
            if then == "queued":
                self.requeued["expired"] += 1
        elif kind == "job.queued" and "token" in ev:  # report.lua's: a fenced evaluation queued again
            self.requeued["fenced"] += 1
        elif kind == "job.retrying":
            self.requeued["retrying"] += 1
        elif kind == "lease.released":
            self.requeued["released"] += 1
        elif kind == "lease.stale_report":
            self.stale += 1
        elif kind == "lease.foreign_token":
            self.foreign += 1
        elif kind == "provisioner.starting":
            self.started[self._pool(ev.get("pool", ""))] += 1
        elif kind == "provisioner.backoff":
            pool = self._pool(ev.get("pool", ""))
            self.backoffs[pool] += 1
            if ev.get("refused") == "1":
                self.refusals[pool] += 1

    def collect(self) -> Iterator[Metric]:
        self.advance()
        yield _family(
            "piloop_lease_expiries",
            "Leases the pass expired, by what became of the job.",
            "then",
            {t: self.expired[t] for t in (*EXPIRED_THEN, "other")},
        )
        yield _family(
            "piloop_requeues",
            "Jobs put back in their queue: after a lease expired, a fenced report, a failed attempt with attempts "
            "left (`retrying`), or given back by their worker (`released`).",
            "reason",
            {r: self.requeued[r] for r in ("expired", "fenced", "retrying", "released")},
        )
        yield _family(
            "piloop_stale_reports", "Late reports under an old lease token (kept as one event).", None, {"": self.stale}
        )
        yield _family(
            "piloop_foreign_tokens", "Calls that named another worker's lease token, refused.", None, {"": self.foreign}
        )
        pools = sorted(self.rt.executor.pools)
        yield _family(
            "piloop_provisioner_starts",
            "Workers the provisioner began to start.",
            "pool",
            {p: self.started[p] for p in pools} | dict(self.started),
        )
        yield _family(
            "piloop_provisioner_backoffs",
            "Failed starts after which a pool backed off.",
            "pool",
            {p: self.backoffs[p] for p in pools} | dict(self.backoffs),
        )
        yield _family(
            "piloop_provisioner_refusals",
            "Starts the platform refused (a quota, no capacity).",
            "pool",
            {p: self.refusals[p] for p in pools} | dict(self.refusals),
        )


def _family(name: str, doc: str, label: str | None, values: dict[str, int]) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=[label] if label else [])
    for value, n in values.items():
        fam.add_metric([value] if label else [], n)
    return fam
