"""Faults table (the design's Redis rows): Redis killed -9 and restarted from its AOF mid-run, and Redis stopped
for a few seconds. The daemon and the workers wait and recover; no job is lost or run twice."""

from __future__ import annotations

import time

import pytest

from piloop_common.errors import NotFound, Unavailable
from piloop_common.sdk.client import ApiClient
from tests.helpers.redis import RedisProcess, wait_for
from tests.helpers.simworker import SimWorker
from tests.helpers.workers import GRACE, events, marker_job, marker_runs, overlapping, state, tcp_server, token


@pytest.fixture
def own_redis(tmp_path):
    rp = RedisProcess(tmp_path / "redis").start()
    yield rp
    rp.stop(kill=True)


@pytest.fixture
def server_on_own_redis(own_redis, namespace):
    d = tcp_server(own_redis.url, namespace)
    yield d
    d.cleanup()


def _run_jobs_through(d, workers, marker, fault) -> list[str]:
    workers(d, token(d, "wa")).start()
    jobs = [marker_job(d, marker, pool=("serve", "gpu")[i % 2], seconds=1.5) for i in range(6)]
    wait_for(
        lambda: sum(len(marker_runs(marker).get(j, [])) for j in jobs) >= 2,
        30,
        interval=0.05,
        what="jobs to be running",
    )
    fault()
    for j in jobs:
        v = state(d, j, timeout=60)
        assert v["state"] == "succeeded", v
    runs = marker_runs(marker)
    for j in jobs:
        assert not overlapping(runs[j]), runs[j]  # never two at once
        assert [e["job"] for e in events(d, "job.succeeded")].count(j) == 1
    return jobs


def _no_leases_left(rp: RedisProcess, namespace: str) -> None:
    import redis

    with redis.Redis.from_url(rp.url) as r:
        assert not list(r.scan_iter(match=f"{{{namespace}}}:lease:*")), "a lease is left in Redis"


def test_redis_killed_and_restarted_from_its_aof_mid_run_loses_and_doubles_nothing(
    server_on_own_redis, own_redis, workers, namespace, tmp_path
):
    d, marker = server_on_own_redis, tmp_path / "marker"

    def fault():
        own_redis.stop(kill=True)  # kill -9
        own_redis.start()  # the same dir and port: it loads its AOF

    jobs = _run_jobs_through(d, workers, marker, fault)
    runs = marker_runs(marker)
    # a restart well inside the grace period: nothing fenced, nothing requeued, each job ran exactly once
    assert all(len(runs[j]) == 1 for j in jobs), runs
    _no_leases_left(own_redis, namespace)


def test_redis_unreachable_for_a_while_the_daemon_and_workers_wait_and_recover(
    server_on_own_redis, own_redis, workers, namespace, tmp_path
):
    d, marker = server_on_own_redis, tmp_path / "marker"
    with d.api() as api:
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    # a heartbeat while Redis is down answers 503, from a token known without Redis too
    beat = SimWorker(ApiClient(url=d.url, token=token(d, "wbeat")), "gpu", cas_id)
    beat.register()
    beat.heartbeat()

    def fault():
        own_redis.stop()
        down = time.monotonic()
        with d.api() as api, pytest.raises(Unavailable) as e:
            api.call("GET", "/v1/jobs/jnothing")
        assert e.value.code == "unavailable" and "Redis" in e.value.message  # the API answers 503 meanwhile
        with pytest.raises(Unavailable) as e:
            beat.heartbeat()
        assert e.value.code == "unavailable" and "Redis" in e.value.message, e.value.message
        # longer than the grace period, shorter than the fence (toleration − 2 × renew)
        wait_for(lambda: time.monotonic() > down + GRACE + 1.5, GRACE + 3)
        own_redis.start()

    jobs = _run_jobs_through(d, workers, marker, fault)
    runs = marker_runs(marker)
    assert all(len(runs[j]) == 1 for j in jobs), runs
    _no_leases_left(own_redis, namespace)
    assert "event=daemon.redis_back" in d.daemon_log()
    assert "event=worker.reachable" in (d.home / "logs" / "worker-serve.log").read_text()  # retried, never gave up
    # the server's Redis client connects again by itself. wbeat has been silent since the fault, without a lease:
    # past the disruption hold's length (2 × toleration) the pass forgets it, and it is told to register again
    try:
        beat.heartbeat()
    except NotFound:
        beat.register()
    assert beat.heartbeat() == beat.heartbeat() == {}
