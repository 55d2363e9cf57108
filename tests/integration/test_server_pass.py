"""The daemon's pass under a real `piloop serve`: mass disruption holds requeues; poison jobs end lost."""

from __future__ import annotations

import json
import time

import pytest

from piloop_common.sdk.client import ApiClient
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.simworker import SimWorker

GPU = "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 1\nmax_load = 1000\nmin_memory_gb = 0\n"


@pytest.fixture
def gpu_daemon(redis_server, namespace):
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR.replace("pass_seconds = 0.2", "pass_seconds = 0.2\nmax_lost = 2") + GPU,
        redis_url=redis_server.url,
        namespace=namespace,
    )
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"
    yield d
    d.cleanup()


def _workers(d: Daemon, n: int) -> list[SimWorker]:
    with d.api() as api:
        cas = api.call("GET", "/v1/status")["cas"]["id"]
        out = []
        for i in range(n):
            token = api.call("POST", "/v1/tokens", {"name": f"gpu{i}"})["token"]
            w = SimWorker(ApiClient(url=d.url, token=token), "gpu", cas)
            w.register()
            out.append(w)
    return out


def _submit(d: Daemon, n: int) -> list[str]:
    with d.api() as api:
        return [api.call("POST", "/v1/jobs", {"pool": "gpu", "spec": {"argv": ["true"]}})["job"] for _ in range(n)]


def _state(d: Daemon, job: str) -> str:
    with d.api() as api:
        return api.call("GET", f"/v1/jobs/{job}")["state"]


def _events(d: Daemon) -> list[dict]:
    with d.api() as api:
        return api.call("GET", "/v1/events", params={"last": 1000})


def test_most_of_a_pool_going_silent_holds_requeues_and_escalates(gpu_daemon):
    d = gpu_daemon
    ws = _workers(d, 3)
    jobs = _submit(d, 3)
    for w in ws:
        w.heartbeat()
        assert len(w.claim()["leases"]) == 1
    survivor = ws[0]
    # two of three go silent at once: a network blip looks like this, so the pass holds
    wait_for(
        lambda: (
            any(e["type"] == "escalation" and "pool.disrupted" in e.get("what", "") for e in _events(d))
            or (survivor.heartbeat() and None)
        ),
        10,
        interval=0.3,
        what="the disruption escalation",
    )
    with d.api() as api:
        inbox = api.call("GET", "/v1/inbox")
    assert any(e["what"] == "pool.disrupted" and "2 of 3 workers of pool gpu" in e["message"] for e in inbox)
    # past toleration (6 s) the silent workers' leases would expire; while held (2 × 6 s) they stay
    held = [j for j, w in zip(jobs, ws, strict=True) if w is not survivor]

    def still_held() -> bool:
        survivor.heartbeat()
        return all(_state(d, j) in ("leased", "running") for j in held) and not any(
            e["type"] == "lease.expired" for e in _events(d)
        )

    # watch through a whole toleration period after the escalation: a held lease must not expire
    end = time.monotonic() + 6.5
    while time.monotonic() < end:
        assert still_held(), "a held lease expired during the disruption"
        time.sleep(0.3)
    # the hold has a deadline too: after two toleration periods the leases expire as usual
    wait_for(
        lambda: all(_state(d, j) == "queued" for j in held) or (survivor.heartbeat() and None),
        20,
        interval=0.3,
        what="the held leases to expire after the hold's deadline",
    )


def test_an_evaluation_lost_max_lost_times_ends_lost_with_an_escalation(gpu_daemon):
    d = gpu_daemon
    (w,) = _workers(d, 1)
    (job,) = _submit(d, 1)
    for attempt in range(2):
        w.register()
        w.heartbeat()
        (_lease,) = w.claim()["leases"]
        w.held.clear()  # then silent: the lease lapses and the pass takes it back
        wait_for(lambda: _state(d, job) in ("queued", "lost"), 15, interval=0.2, what=f"loss {attempt + 1}")
    assert _state(d, job) == "lost"
    with d.api() as api:
        view = api.call("GET", f"/v1/jobs/{job}")
        inbox = api.call("GET", "/v1/inbox")
    assert view["lost"] == 2 and view["attempts"] == 0 and "lost 2 times in a row" in view["reason"]
    assert any(e["what"] == "job.lost" and job in e["message"] for e in inbox)
    assert json.dumps(inbox)  # it is plain data the CLI can print
