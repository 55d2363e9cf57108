"""The gauges read from state at each scrape, through what `piloop status` reads (`workers.views`,
`workers.pool_summary`, the provisioner's summary) and the queue views of `state/jobs.py`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from piloop_common.protocol.operator import WorkerView
from piloop_server import workers
from piloop_server.pools import WAITING_CODES
from piloop_server.provisioner.manager import LIVE
from piloop_server.provisioner.manager import summary as provisioned_pools
from piloop_server.state.records.lease import KINDS

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime

WORKER_STATES = ("ready", "draining", "unreachable", "starting", "stopping")


def worker_state(w: WorkerView) -> str:
    """A worker's state as a label: reachable (`ready` or `draining`), or why not."""
    if w.reachable:
        return "draining" if w.draining else "ready"
    if w.seen_seconds is None and w.no_lease in ("starting", "stopping"):
        return w.no_lease  # started by the server, not yet registered (or on its way out)
    return "unreachable"


class StateGauges(Collector):
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def collect(self) -> Iterator[Metric]:
        rt = self.rt
        pools = sorted(rt.executor.pools)
        now = workers.now_ms(rt)
        jobs = GaugeMetricFamily("piloop_jobs", "Jobs waiting or holding a lease.", labels=["pool", "kind", "state"])
        depth = GaugeMetricFamily("piloop_queue_depth", "Jobs in the queue.", labels=["pool", "kind"])
        oldest = GaugeMetricFamily(
            "piloop_queue_oldest_seconds",
            "Age of the first job in line, since it was first queued (0: the queue is empty).",
            labels=["pool", "kind"],
        )
        leases = GaugeMetricFamily("piloop_leases", "Live leases (leased or running jobs).", labels=["pool", "kind"])
        for (pool, kind), q in rt.jobs.queues(pools, KINDS).items():
            for state, n in (("queued", q.queued), ("leased", q.leased), ("running", q.running)):
                jobs.add_metric([pool, kind, state], n)
            depth.add_metric([pool, kind], q.queued)
            oldest.add_metric([pool, kind], max(0.0, (now - q.oldest_ms) / 1000) if q.oldest_ms is not None else 0.0)
            leases.add_metric([pool, kind], q.leased + q.running)
        yield from (jobs, depth, oldest, leases)
        yield from self._workers(pools)
        yield from self._provisioners()
        mem = rt.retention.memory()
        yield GaugeMetricFamily("piloop_redis_used_memory_bytes", "Redis's used_memory (INFO).", value=mem.used)
        yield GaugeMetricFamily("piloop_redis_maxmemory_bytes", "Redis's maxmemory (0: no limit).", value=mem.maxmemory)

    def _workers(self, pools: list[str]) -> Iterator[Metric]:
        views = workers.views(self.rt)
        fam = GaugeMetricFamily("piloop_workers", "Workers by pool and state.", labels=["pool", "state"])
        for pool in pools:
            states = [worker_state(w) for w in views if w.pool == pool]
            for state in WORKER_STATES:
                fam.add_metric([pool, state], states.count(state))
        yield fam
        slots = GaugeMetricFamily(
            "piloop_slots",
            "Slots of the pool's usable workers (reachable, not draining, admitted).",
            labels=["pool", "kind"],
        )
        free = GaugeMetricFamily("piloop_slots_free", "Of those, the slots no lease holds.", labels=["pool", "kind"])
        waiting = GaugeMetricFamily(
            "piloop_queue_waiting",
            "Queued jobs that no worker of their pool takes now, by why (`piloop status` says it in words).",
            labels=["pool", "kind", "reason"],
        )
        for row in workers.pool_summary(self.rt, views):
            for kind in KINDS:
                slots.add_metric([row["pool"], kind], row[f"{kind}_slots"])
                free.add_metric([row["pool"], kind], row[f"{kind}_free"])
                code = row["waiting_codes"].get(kind)
                for reason in WAITING_CODES:
                    waiting.add_metric([row["pool"], kind, reason], row[f"{kind}_queued"] if reason == code else 0)
        yield from (slots, free, waiting)

    def _provisioners(self) -> Iterator[Metric]:
        rows = provisioned_pools(self.rt)
        started = GaugeMetricFamily(
            "piloop_provisioned_workers", "Workers the server started, by state.", labels=["pool", "state"]
        )
        backoff = GaugeMetricFamily(
            "piloop_provisioner_backoff_seconds", "A pool's current start backoff (0: none).", labels=["pool"]
        )
        refusals = GaugeMetricFamily(
            "piloop_provisioner_refusals_in_a_row", "Starts refused in a row (three escalate).", labels=["pool"]
        )
        for row in rows:
            for state in LIVE:
                started.add_metric([row["pool"], state], row[state])
            backoff.add_metric([row["pool"]], row["backoff_seconds"] if row["backoff_left_seconds"] > 0 else 0.0)
            refusals.add_metric([row["pool"]], row["refusals"])
        yield from (started, backoff, refusals)
