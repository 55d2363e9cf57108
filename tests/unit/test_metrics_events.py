"""The event-stream counters: which event moves which counter, with bounded labels, each event counted once."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from piloop_server.metrics.events import EventCounts


class _Stream:
    def __init__(self, events: list[dict[str, str]]) -> None:
        self.events = [{**e, "id": f"{i + 1}-0"} for i, e in enumerate(events)]

    def read(self, after: str, count: int) -> list[dict[str, str]]:
        start = 0 if after.isdigit() and len(after) > 6 else int(after.split("-")[0])
        return self.events[start : start + count]


def _samples(counts: EventCounts) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry()
    reg.register(counts)
    text = generate_latest(reg).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_each_event_moves_its_counter_once_with_bounded_labels():
    stream = _Stream(
        [
            {"type": "lease.expired", "job": "j1", "then": "queued"},
            {"type": "lease.expired", "job": "j2", "then": "worker_lost"},
            {"type": "lease.expired", "job": "j3", "then": "something-new"},
            {"type": "job.queued", "job": "j4", "token": "t"},  # a fenced report's
            {"type": "job.queued", "job": "j5", "pool": "gpu", "kind": "evaluation"},  # a submit: no requeue
            {"type": "job.retrying", "job": "j6"},
            {"type": "lease.stale_report", "job": "j7"},
            {"type": "lease.foreign_token", "job": "j8", "worker": "evil"},
            {"type": "provisioner.starting", "pool": "gpu", "worker": "gpu-1"},
            {"type": "provisioner.backoff", "pool": "gpu", "refused": "1"},
            {"type": "provisioner.backoff", "pool": "gone-from-config", "refused": "0"},
        ]
    )
    rt = SimpleNamespace(executor=SimpleNamespace(pools={"gpu": None, "serve": None}), events=stream)
    counts = EventCounts(rt)  # type: ignore[arg-type]
    m = _samples(counts)
    assert m[("piloop_lease_expiries_total", (("then", "queued"),))] == 1
    assert m[("piloop_lease_expiries_total", (("then", "worker_lost"),))] == 1
    assert m[("piloop_lease_expiries_total", (("then", "other"),))] == 1
    assert m[("piloop_requeues_total", (("reason", "expired"),))] == 1
    assert m[("piloop_requeues_total", (("reason", "fenced"),))] == 1
    assert m[("piloop_requeues_total", (("reason", "retrying"),))] == 1
    assert m[("piloop_stale_reports_total", ())] == 1
    assert m[("piloop_foreign_tokens_total", ())] == 1
    assert m[("piloop_provisioner_starts_total", (("pool", "gpu"),))] == 1
    assert m[("piloop_provisioner_refusals_total", (("pool", "gpu"),))] == 1
    assert m[("piloop_provisioner_backoffs_total", (("pool", "other"),))] == 1
    assert m[("piloop_provisioner_starts_total", (("pool", "serve"),))] == 0
    assert _samples(counts) == m  # a second scrape reads on from its cursor: nothing counted twice
    labels = {v for _, ls in m for _, v in ls}
    assert not labels & {"j1", "j4", "gpu-1", "evil", "gone-from-config"}
