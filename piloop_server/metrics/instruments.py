"""The metrics one API process keeps: its own counters and histograms, beside the gauges read from state and the
counters read from the event stream at each scrape, all in one registry per app (docs/metrics.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from piloop_server.metrics.events import EventCounts
from piloop_server.metrics.gauges import StateGauges

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime

# a worker's call costs about a millisecond of Redis at rest; the long tail is a busy Redis or a slow CAS lookup
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CALLS = ("claim", "report", "heartbeat")
OUTCOMES = ("succeeded", "failed", "cancelled", "fenced", "lost")


class Metrics:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.registry = CollectorRegistry()
        r = self.registry
        self.call_seconds = Histogram(
            "piloop_worker_call_seconds",
            "Time the API spent on a worker's call (a claim's: its lease work, not its long-poll wait).",
            ["call"],
            buckets=BUCKETS,
            registry=r,
        )
        self.leases_granted = Counter(
            "piloop_leases_granted", "Leases the API's claims granted.", ["pool", "kind"], registry=r
        )
        self.reports = Counter(
            "piloop_reports",
            "Reports the API answered, by the worker's outcome and the answer (`stale`: late or foreign).",
            ["outcome", "answer"],
            registry=r,
        )
        self.cas_bytes = Counter(
            "piloop_cas_bytes",
            "Bytes through the daemon's own `/v1/cas/blobs` routes (`read`: sent to a caller, `written`: stored).",
            ["direction"],
            registry=r,
        )
        self.fetched_bytes = Counter(
            "piloop_worker_fetched_bytes",
            "Bytes of repo bundles workers fetched from the CAS, as their reports say.",
            registry=r,
        )
        for call in CALLS:  # each series from the first scrape, so rate() sees its first event
            self.call_seconds.labels(call)
        for direction in ("read", "written"):
            self.cas_bytes.labels(direction)
        self.events = EventCounts(rt)
        r.register(self.events)
        r.register(StateGauges(rt))

    @contextmanager
    def timed(self, call: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.call_seconds.labels(call).observe(time.perf_counter() - started)

    def report(self, outcome: str, answer: str) -> None:
        self.reports.labels(outcome if outcome in OUTCOMES else "other", answer or "error").inc()

    def pool(self, name: str) -> str:
        """A pool's name as a label: one of config.toml's, or `other` (a label set stays bounded)."""
        return name if name in self.rt.executor.pools else "other"

    def text(self) -> bytes:
        """The exposition, read at this moment (the gauges and event counts read Redis: call it off the loop)."""
        return generate_latest(self.registry)
