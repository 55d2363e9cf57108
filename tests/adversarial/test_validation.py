"""Validate at the door, read defensively (issue 46, item 4): what an older version could have let into Redis (a
job whose argv holds a lone surrogate, a spec with an absurd number, a worker whose sample is not one) never makes
a listing answer 500: each skips the record, says how many it skipped, and lists the rest. And the door now refuses
such values with a 4xx, writing nothing."""

from __future__ import annotations

import httpx
import pytest

from piloop_common.protocol.worker import SKIPPED_HEADER
from tests.helpers.adversary import LONG_TIMINGS
from tests.helpers.keyspace import DAEMON_CHURN, settled
from tests.helpers.workers import HandWorker, submit, token

CHURN = (*DAEMON_CHURN, "dependencies:cursor")  # the pass's own


@pytest.fixture(scope="module")
def world(tcp_daemon):
    s = tcp_daemon(LONG_TIMINGS)
    return s.d, s.r, s.k


def test_the_door_refuses_what_redis_could_not_hold(world):
    d, r, k = world
    tok = token(d, "op", "--role", "operator")
    before = settled(r, k, CHURN)
    with httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {tok}"}) as c:
        for spec in (
            '{"argv": ["a\\ud800"]}',
            '{"argv": ["a\\u0000"]}',
            '{"argv": ["a"], "memory_mb": 1e18}',
            '{"argv": ["a"], "memory_mb": 1000000000000000000}',
            '{"argv": ["a"], "expires_seconds": 1e308}',
            '{"argv": ["a"], "timeout_seconds": Infinity}',
            '{"argv": ["a"], "timeout_seconds": NaN}',
            '{"argv": ["a"], "env": {"A=B": "1"}}',
            '{"argv": ["a"], "env": {"LD_PRELOAD": "/x.so"}}',
            '{"argv": ["a"], "env": {"PILOOP_RELAY": "x"}}',
            '{"argv": ["a"], "inputs": {"../../x": "sha256:' + "ab" * 32 + '"}}',
            '{"argv": ["a"], "inputs": {"/etc/x": "sha256:' + "ab" * 32 + '"}}',
        ):
            body = '{"kind": "evaluation", "pool": "gpu", "spec": ' + spec + "}"
            got = c.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
            assert got.status_code in (400, 413, 422), (spec, got.status_code, got.text)
            assert "Traceback" not in got.text, got.text
        for cron in ("0 0 30 2 *", "* * * * * * *", "0 0 * * * 2099 1"):
            job = {"kind": "evaluation", "pool": "gpu", "spec": {"argv": ["a"]}}
            got = c.post("/v1/schedules", json={"name": "s", "cron": cron, "job": job})
            assert got.status_code == 400 and "--cron" in got.json()["message"], (cron, got.text)
    assert settled(r, k, CHURN) == before


def test_a_poison_record_is_skipped_and_named_by_every_listing(world):
    d, r, k = world
    good = submit(d, "true", pool="judge")
    # what an older version wrote: JSON text with a lone surrogate's escape, an absurd number, a sample not one
    r.hset(
        k.job("jpoison1"),
        mapping={
            "id": "jpoison1",
            "kind": "evaluation",
            "pool": "gpu",
            "state": "queued",
            "spec": '{"argv": ["a\\ud800"]}',
            "created": "1",
        },
    )
    r.hset(
        k.job("jpoison2"),
        mapping={
            "id": "jpoison2",
            "kind": "evaluation",
            "pool": "gpu",
            "state": "queued",
            "spec": '{"argv": ["a"], "memory_mb": 1e18}',
            "created": "2",
            "grant_mb": "x",
        },
    )
    r.hset(
        k.job("jpoison3"),
        mapping={
            "id": "jpoison3",
            "kind": "evaluation",
            "pool": "gpu",
            "state": "queued",
            "spec": "{}",
            "created": "3",
            "result": '{"exit_code": "\\ud800"}',
        },
    )
    for i, jid in enumerate(("jpoison1", "jpoison2", "jpoison3")):
        r.zadd(k.queue("gpu", "evaluation"), {jid: i})
        r.zadd(k.jobs(), {jid: 10**13 + i})
    now_ms = r.time()[0] * 1000
    r.hset(k.worker("ghost"), mapping={"name": "ghost", "pool": "gpu", "sample": '{"cpus": "many"}', "seen": now_ms})
    r.set(k.worker_alive("ghost"), "1", px=60_000)
    r.sadd(k.workers(), "ghost")
    r.hset(k.schedules(), "bad", '{"name": "bad", "cron": "* * * * * * *"')  # cut short, a 7-field cron
    r.zadd(k.schedule_ticks(), {"bad": 0})  # due now: the pass meets it every time
    with httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {token(d, 'v', '--role', 'viewer')}"}) as c:
        jobs = c.get("/v1/jobs")
        assert jobs.status_code == 200, jobs.text
        assert good in [j["id"] for j in jobs.json()] and int(jobs.headers[SKIPPED_HEADER]) >= 2, jobs.headers
        for jid in ("jpoison1", "jpoison2", "jpoison3"):
            shown = c.get(f"/v1/jobs/{jid}")
            assert shown.status_code < 500 and "Traceback" not in shown.text, (jid, shown.status_code, shown.text)
        ws = c.get("/v1/workers")
        assert ws.status_code == 200 and ws.headers[SKIPPED_HEADER] == "1", (ws.status_code, ws.text)
        st = c.get("/v1/status")
        assert st.status_code == 200 and st.json()["skipped"] == {"workers": 1}, st.text
        assert c.get(f"/v1/jobs/{good}").status_code == 200
        sched = c.get("/v1/schedules")
        assert sched.status_code == 200 and sched.headers[SKIPPED_HEADER] == "1", (sched.status_code, sched.text)
    # a worker's claim meets the poison jobs at the queue's head: it is answered, never a 500, and they end
    w = HandWorker(d, "gpua", token(d, "gpua", "--pool", "gpu"), "gpu").register()
    try:
        for _ in range(3):
            got = w.post("claim", {"want": {"evaluation": 4}})
            assert got.status_code == 200, got.text
    finally:
        w.close()
    log = (d.home / "logs" / "test-daemon.log").read_text()
    for record in ("worker", "job", "schedule"):
        assert f"event=record.skipped record={record}" in log, record
    assert r.hget(k.job("jpoison1"), "state") == b"cancelled"  # claimed, unreadable: ended, not run
