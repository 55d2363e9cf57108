"""Every count and size a caller chooses has a cap (issue 46, item 3), each a [plugins.state] key: over it the call
is a 4xx naming the key and nothing is written. A claim's `want` is cut before anything is built (the daemon's
RSS is measured across a flood), and one token driven as hard as it can over every write it has grows Redis by a
bounded amount."""

from __future__ import annotations

import json

import httpx
import psutil
import pytest
import redis

from piloop_server.state.keys import Keys
from tests.helpers.adversary import LONG_TIMINGS
from tests.helpers.keyspace import DAEMON_CHURN, settled
from tests.helpers.workers import HandWorker, token

CAPS = {
    "claim_want_max": 16,
    "worker_info_max_bytes": 1024,
    "worker_names_max": 3,
    "job_argv_max": 8,
    "job_env_max": 4,
    "job_inputs_max": 4,
    "job_spec_max_bytes": 4096,
    "schedule_min_period_seconds": 120,
}
ADDR = "sha256:" + "ab" * 32


class World:
    def __init__(self, d, r: redis.Redis, ns: str) -> None:
        self.d, self.r, self.ns = d, r, ns
        self.k = Keys(ns)
        self.op = httpx.Client(
            base_url=d.url, timeout=30, headers={"Authorization": f"Bearer {token(d, 'ops', '--role', 'operator')}"}
        )


CHURN = (*DAEMON_CHURN, "dependencies:cursor")  # the pass's own


@pytest.fixture(scope="module")
def world(tcp_daemon):
    s = tcp_daemon(LONG_TIMINGS, env={"PILOOP_PLUGINS": json.dumps({"state": CAPS})})
    w = World(s.d, s.r, s.ns)
    try:
        yield w
    finally:
        w.op.close()


def refused(resp: httpx.Response, key: str) -> None:
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert f"[plugins.state] {key}" in resp.json()["message"], resp.text


def job(spec: dict) -> dict:
    return {"kind": "evaluation", "pool": "gpu", "spec": {"argv": ["true"], **spec}}


def test_a_jobs_argv_env_inputs_and_total_are_capped(world):
    before = settled(world.r, world.k, CHURN)
    for spec, key in (
        ({"argv": ["x"] * 9}, "job_argv_max"),
        ({"env": {f"V{i}": "1" for i in range(5)}}, "job_env_max"),
        ({"inputs": {f"f{i}": ADDR for i in range(5)}}, "job_inputs_max"),
        ({"argv": ["x" * 5000]}, "job_spec_max_bytes"),
    ):
        refused(world.op.post("/v1/jobs", json=job(spec)), key)
        refused(world.op.post("/v1/schedules", json={"name": "s1", "cron": "0 * * * *", "job": job(spec)}), key)
    assert settled(world.r, world.k, CHURN) == before
    ok = world.op.post("/v1/jobs", json=job({"argv": ["x"] * 8, "env": {f"V{i}": "1" for i in range(4)}}))
    assert ok.status_code == 200, ok.text  # at the caps: taken
    world.op.post(f"/v1/jobs/{ok.json()['job']}/cancel")


def test_a_schedule_may_not_fire_more_often_than_the_cap(world):
    before = settled(world.r, world.k, CHURN)
    for cron in ("* * * * *", "* * * * * *", "0,1 * * * *"):
        resp = world.op.post("/v1/schedules", json={"name": "often", "cron": cron, "job": job({})})
        refused(resp, "schedule_min_period_seconds")
    assert settled(world.r, world.k, CHURN) == before
    ok = world.op.post("/v1/schedules", json={"name": "hourly", "cron": "0 * * * *", "job": job({})})
    assert ok.status_code == 200, ok.text
    assert world.op.delete("/v1/schedules/hourly").status_code == 200


def test_a_workers_info_and_image_and_a_tokens_names_are_capped(world):
    tok = token(world.d, "fleet", "--pool", "gpu", "--rename")
    w = HandWorker(world.d, "fleet-0", tok, "gpu")
    w.http.headers["x-piloop-worker"] = "fleet-0"
    try:
        before = settled(world.r, world.k, CHURN)
        refused(w.post("register", {**w.hello(), "info": {"host": "x" * 2000}}), "worker_info_max_bytes")
        refused(w.post("register", {**w.hello(), "image": "i" * 2000}), "worker_info_max_bytes")
        assert settled(world.r, world.k, CHURN) == before
        for i in range(3):
            w.http.headers["x-piloop-worker"] = f"fleet-{i}"
            assert w.post("register", w.hello()).status_code == 200
        w.http.headers["x-piloop-worker"] = "fleet-3"
        refused(w.post("register", w.hello()), "worker_names_max")
        assert not world.r.exists(world.k.worker("fleet-3"))
        w.http.headers["x-piloop-worker"] = "fleet-1"  # a name it holds registers again
        assert w.post("register", w.hello()).status_code == 200
    finally:
        w.close()


def test_a_want_flood_builds_nothing(world):
    w = HandWorker(world.d, "flood", token(world.d, "flood", "--pool", "gpu"), "gpu").register()
    proc = psutil.Process(world.d.proc.pid)
    try:
        rss = proc.memory_info().rss
        for want in (10**12, 10**6):
            got = w.post("claim", {"want": {"evaluation": want}})
            assert got.status_code == 400 and "want.evaluation" in got.text, got.text  # past any config: the model
        refused(w.post("claim", {"want": {"evaluation": 17}}), "claim_want_max")
        for _ in range(50):  # at the cap, again and again: cut to the worker's 4 slots before a token is built
            got = w.post("claim", {"want": {"evaluation": 16, "agent": 16}})
            assert got.status_code == 200 and got.json()["leases"] == [], got.text
        grown = proc.memory_info().rss - rss
        assert grown < 16 * 1024**2, f"the daemon grew {grown / 1024**2:.1f} MiB over the flood"
        world.d.proc.terminate()  # SIGTERM still stops it at once
        world.d.proc.wait(timeout=30)
    finally:
        w.close()
        world.d.start(listen=world.d.listen)


def test_one_token_driven_hard_grows_redis_by_a_bound(world):
    tok = token(world.d, "hammer", "--pool", "gpu", "--rename")
    w = HandWorker(world.d, "hammer-0", tok, "gpu")
    base_keys, base_mem = world.r.dbsize(), world.r.info("memory")["used_memory"]
    try:
        for i in range(300):
            w.http.headers["x-piloop-worker"] = f"hammer-{i}"
            big = {**w.hello(), "info": {"host": "h" * 900}, "image": "m" * 900}
            w.post("register", big)
            w.post("heartbeat", {**w.hello(), "admission": "a" * 64})
            w.post("claim", {"want": {"evaluation": 16, "agent": 16}})
            w.post("log", {"job": f"j{i:011d}", "token": "1" * 20 + ".ab", "chunks": [ADDR] * 256})
            w.post("release", {"job": f"j{i:011d}", "token": "1" * 20 + ".ab", "reason": "r" * 10_000})
            w.post(
                "report", {"report_id": f"r{i}", "job": f"j{i:011d}", "token": "1" * 20 + ".ab", "outcome": "succeeded"}
            )
    finally:
        w.close()
    keys = world.r.dbsize() - base_keys
    mem = world.r.info("memory")["used_memory"] - base_mem
    # three names at most (the cap), each a hash, an alive key and the token's set: a few keys and a few KiB each
    assert keys <= 3 * 3 + 2, keys
    assert mem < 2 * 1024**2, f"Redis grew {mem / 1024:.0f} KiB under one token"
