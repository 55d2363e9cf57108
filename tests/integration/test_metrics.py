"""`/metrics` against a real `piloop serve` with real jobs and workers: the values beside `piloop status --json`,
the counters moving after a claim and a report, the token-free listener; `/docs` and `/openapi.json` behind it."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from piloop_common.sdk.client import SOCKET_NAME, ApiClient
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.simworker import SimWorker
from tests.helpers.workers import RemoteWorker, state, submit, token

GPU = "\n[plugins.executor.pools.gpu]\nagents = 1\nevaluations = 2\nmax_load = 1000\nmin_memory_gb = 0\n"


def _daemon(redis_server, network: str) -> Daemon:
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + GPU + "\n[plugins.network]\n" + network,
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
    )
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return d


@pytest.fixture(scope="module")
def served(redis_server):
    port = free_port()
    d = _daemon(redis_server, f'metrics_listen = "127.0.0.1:{port}"\n')
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    yield d
    d.cleanup()


def _socket(d: Daemon) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(d.home / SOCKET_NAME)), base_url="http://piloop")


def scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the token-free listener, by name and labels (the text parsed as Prometheus parses it)."""
    r = httpx.get(d.metrics_url, timeout=10)  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def _status(d: Daemon) -> dict:
    st = json.loads(d.cli("status", "--json", check=True).stdout)
    return {p["pool"]: p for p in st["pools"]}


def _v(m: dict, name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_agree_with_status_and_counters_move(served):
    d = served
    tok = d.cli("token", "create", "m1", check=True).stdout.strip()
    with d.api() as api:
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
        for _ in range(3):
            d.cli("job", "submit", "--pool", "gpu", "--kind", "evaluation", "--", "true", check=True)
    before = scrape(d)
    with ApiClient(url=d.url, token=tok) as wapi:  # type: ignore[attr-defined]
        w = SimWorker(wapi, "gpu", cas_id)
        w.register()
        got = w.claim(evaluation=1)
        assert len(got["leases"]) == 1, got
        lease = got["leases"][0]
        w.heartbeat()

        def agree():
            m, st = scrape(d), _status(d)["gpu"]
            return (
                _v(m, "piloop_queue_depth", pool="gpu", kind="evaluation") == st["evaluation_queued"] == 2
                and _v(m, "piloop_leases", pool="gpu", kind="evaluation") == st["evaluation_running"] == 1
                and _v(m, "piloop_workers", pool="gpu", state="ready") == st["reachable"] == 1
                and _v(m, "piloop_slots", pool="gpu", kind="evaluation") == st["evaluation_slots"]
                and _v(m, "piloop_slots_free", pool="gpu", kind="evaluation") == st["evaluation_free"]
                and m
            )

        m = wait_for(agree, timeout=15, what="/metrics agrees with piloop status --json")
        assert _v(m, "piloop_queue_oldest_seconds", pool="gpu", kind="evaluation") > 0
        assert _v(m, "piloop_jobs", pool="gpu", kind="evaluation", state="queued") == 2
        assert _v(m, "piloop_redis_used_memory_bytes") > 0
        granted = ("piloop_leases_granted_total", (("kind", "evaluation"), ("pool", "gpu")))
        assert m[granted] == before.get(granted, 0) + 1
        claims = ("piloop_worker_call_seconds_count", (("call", "claim"),))
        assert m[claims] >= before[claims] + 1
        beats = ("piloop_worker_call_seconds_count", (("call", "heartbeat"),))
        assert m[beats] >= before[beats] + 1

        w.report(lease["job"], "succeeded", token=lease["token"])
        w.report(lease["job"], "succeeded", token=lease["token"] + "0")  # a late copy: answered stale
    m = wait_for(
        lambda: (
            (m := scrape(d))[("piloop_reports_total", (("answer", "accepted"), ("outcome", "succeeded")))] >= 1 and m
        ),
        what="the report counted",
    )
    assert m[("piloop_worker_call_seconds_count", (("call", "report"),))] >= 2
    assert m[("piloop_reports_total", (("answer", "stale"), ("outcome", "succeeded")))] >= 1
    assert m[("piloop_stale_reports_total", ())] >= 1  # from the event stream (`lease.stale_report`)
    assert _v(m, "piloop_leases", pool="gpu", kind="evaluation") == 0
    # no job id, token or worker name in any label: the label sets stay bounded
    values = {v for _, labels in scrape(d) for _, v in labels}
    assert not values & {lease["job"], lease["token"], w.name, "m1"}, values


def test_a_real_worker_running_a_job_shows_as_piloop_status_says(served):
    d = served
    w = RemoteWorker(d, token(d, "m3")).start()
    try:
        job = submit(d, "sleep", "60")
        state(d, job, "running")

        def agree():
            m, st = scrape(d), _status(d)["gpu"]
            return (
                _v(m, "piloop_jobs", pool="gpu", kind="evaluation", state="running") == 1
                and _v(m, "piloop_leases", pool="gpu", kind="evaluation") == st["evaluation_running"] == 1
                and _v(m, "piloop_workers", pool="gpu", state="ready") == st["reachable"]
                and _v(m, "piloop_slots_free", pool="gpu", kind="evaluation") == st["evaluation_free"]
            )

        wait_for(agree, timeout=20, what="/metrics agrees with piloop status --json while a job runs")
        d.cli("job", "cancel", job, check=True)
        state(d, job, "cancelled")
    finally:
        w.cleanup()


def test_main_listener_needs_an_operator(served):
    d = served
    tok = d.cli("token", "create", "m2", check=True).stdout.strip()
    for path in ("/metrics", "/openapi.json", "/docs"):
        anon = httpx.get(d.url + path)  # type: ignore[attr-defined]
        assert anon.status_code == 401, (path, anon.text)
        worker = httpx.get(d.url + path, headers={"authorization": f"Bearer {tok}"})  # type: ignore[attr-defined]
        assert worker.status_code == 403 and "needs the viewer role" in worker.json()["message"], (path, worker.text)
    with _socket(d) as s:
        r = s.get("/metrics")
        assert r.status_code == 200 and "piloop_queue_depth" in r.text
        assert s.get("/openapi.json").json()["paths"]["/v1/jobs"]
        assert "swagger-ui" in s.get("/docs").text


def test_api_docs_off_are_not_served(redis_server):
    d = _daemon(redis_server, 'api_docs = "off"\nmetrics_listen = ""\n')
    try:
        with _socket(d) as s:
            assert s.get("/openapi.json").status_code == 404
            assert s.get("/docs").status_code == 404
            assert s.get("/metrics").status_code == 200
        assert httpx.get(d.url + "/openapi.json").status_code == 404  # type: ignore[attr-defined]
    finally:
        d.cleanup()
