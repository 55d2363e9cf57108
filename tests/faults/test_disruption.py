"""The disruption hold (docs/faults.md): when most of a pool goes silent at once its leases wait, one inbox item says
so, the hold's start and end live in Redis (a restart or a pause of the daemon neither resets nor repeats it), and
only workers that could still come back count. Real `piloop serve`, real Redis, protocol-level workers over HTTP."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis

from piloop_common.config.settings import ExecutorConfig
from piloop_common.sdk.client import ApiClient
from piloop_server.daemon import disruption_policy
from piloop_server.state.disruption import DisruptionState
from piloop_server.state.keys import Keys
from piloop_server.state.records.token import Token
from piloop_server.state.scripts import Scripts
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon
from tests.helpers.simworker import SimWorker
from tests.helpers.slowdown import scaled
from tests.helpers.workers import GRACE, TOLERATION, events, state, tcp_server

HOLD = 2 * TOLERATION  # the hold's length, and how long a silent worker without leases stays listed
SLACK = 2.0  # a pass is 0.2 s; the machine is shared


@pytest.fixture
def gpu(redis_server, namespace) -> Iterator[Daemon]:
    d = tcp_server(redis_server.url, namespace)
    yield d
    d.cleanup()


@pytest.fixture
def gpu_long_hold(redis_server, namespace) -> Iterator[tuple[Daemon, float]]:
    """The `gpu` fixture's server with its toleration (so its hold) stretched by the tests' slowdown factor: a hold
    that outlasts a restart of the daemon on a loaded machine. The server and the toleration it was given (the
    factor follows the load, so it is read once, here)."""
    line = f"toleration_seconds = {TOLERATION:g}\n"
    assert line in FAST_EXECUTOR  # the stretch below must not be a silent no-op
    toleration = float(math.ceil(scaled(TOLERATION)))  # whole seconds: the hold's ms are exact on both sides
    config = FAST_EXECUTOR.replace(line, f"toleration_seconds = {toleration:g}\n")
    d = tcp_server(redis_server.url, namespace, config=config)
    yield d, toleration
    d.cleanup()


@pytest.fixture
def disruption(redis_client, namespace) -> DisruptionState:
    return DisruptionState(redis_client, Keys(namespace))


class Beats:
    """Heartbeats for the workers that stay, every renew period, in a thread; a call the server does not answer
    (stopped, paused) is tried again at the next beat, as a worker would."""

    def __init__(self, ws: list[SimWorker]) -> None:
        self.ws = ws
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.3):
            for w in self.ws:
                try:
                    w.heartbeat()
                except Exception:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def _workers(d: Daemon, names: list[str]) -> list[SimWorker]:
    with d.api() as api:
        cas = api.call("GET", "/v1/status")["cas"]["id"]
        out = []
        for name in names:
            token = api.call("POST", "/v1/tokens", {"name": name})["token"]
            w = SimWorker(ApiClient(url=d.url, token=token, timeout=2), "gpu", cas)  # type: ignore[attr-defined]
            w.register()
            out.append(w)
    return out


def _claim_one_each(d: Daemon, ws: list[SimWorker]) -> dict[str, str]:
    """One job leased to each worker: job id -> worker name."""
    with d.api() as api:
        for _ in ws:
            api.call("POST", "/v1/jobs", {"pool": "gpu", "spec": {"argv": ["true"]}})
    held = {}
    for w in ws:
        (lease,) = wait_for(lambda w=w: _claim_alive(w), 10, interval=0.1, what=f"a lease for {w.name}")
        held[lease["job"]] = w.name
    return held


def _claim_alive(w: SimWorker) -> list[dict]:
    """`w`'s claim, a heartbeat before it: registered a while ago on a loaded machine, its alive key (grace long) may
    have lapsed, and a claim from a worker not alive is refused `unreachable`; any other refusal is named."""
    w.heartbeat()
    got = w.claim()
    assert got["leases"] or got["reason"] == "unreachable", f"{w.name} got no lease: {got['reason']}"
    return got["leases"]


def _inbox(d: Daemon) -> list[dict]:
    with d.api() as api:
        return [e for e in api.call("GET", "/v1/inbox", params={"all": True}) if e["what"] == "pool.disrupted"]


def _escalations(d: Daemon) -> list[dict]:
    return [e for e in events(d, "escalation") if e.get("what") == "pool.disrupted"]


def _state(d: Daemon, job: str) -> str:
    with d.api() as api:
        return api.call("GET", f"/v1/jobs/{job}")["state"]


def _passes(redis_client: redis.Redis, namespace: str, n: int) -> None:
    """Wait until the daemon has run `n` more passes (each writes its Redis time into the daemon hash)."""
    key = Keys(namespace).daemon()
    seen: set[bytes] = set()
    wait_for(
        lambda: seen.add(redis_client.hget(key, "last_pass") or b"") or len(seen) > n,
        20 + n,
        interval=0.05,
        what=f"{n} passes",
    )


def _now_ms(redis_client: redis.Redis) -> int:
    """Redis's clock, the one the daemon's scripts keep time by (ms)."""
    secs, micros = redis_client.time()
    return secs * 1000 + micros // 1000


def _ms(event_id: str) -> int:
    return int(event_id.split("-")[0])  # a stream id is the Redis time (ms) the event was added


def test_most_of_a_pool_silent_is_held_with_one_inbox_item_and_a_restart_neither_resets_nor_repeats_it(
    gpu_long_hold, disruption, redis_client, namespace
):
    d, toleration = gpu_long_hold
    hold_seconds = 2 * toleration
    ws = _workers(d, ["gpu0", "gpu1", "gpu2"])
    jobs = _claim_one_each(d, ws)
    claimed_ms = _now_ms(redis_client)  # the silent workers' leases lapse by toleration after this, unless held
    beats = Beats(ws[:1])  # two of three go silent at once
    try:
        hold = wait_for(lambda: disruption.holds().get("gpu"), GRACE + 10, interval=0.1, what="the hold")
        assert (hold.silent, hold.total, hold.ended) == (2, 3, "")
        assert hold.until_ms - hold.since_ms == int(hold_seconds * 1000)
        (item,) = _inbox(d)
        assert "2 of 3 workers of pool gpu went silent at once" in item["message"] and item["id"] == hold.escalation
        silent_jobs = [j for j, w in jobs.items() if w != "gpu0"]
        _passes(redis_client, namespace, 10)
        assert len(_inbox(d)) == 1 and len(_escalations(d)) == 1  # many passes, one item

        d.stop()
        d.start(listen=d.listen)
        _passes(redis_client, namespace, 10)
        assert disruption.holds()["gpu"] == hold  # the same start and end, not a new hold
        assert len(_inbox(d)) == 1 and len(_escalations(d)) == 1
        past_toleration = claimed_ms + int(toleration * 1000) + 500
        wait_for(lambda: _now_ms(redis_client) > past_toleration, toleration + 5, interval=0.1, what="toleration")
        assert all(_state(d, j) in ("leased", "running") for j in silent_jobs)  # past toleration, still held
        now_ms = _now_ms(redis_client)
        assert now_ms < hold.until_ms, "the restart took longer than the hold: the test proves nothing"

        # it ends when it would have without the restart, and the silent workers' jobs come back
        (ended,) = wait_for(lambda: events(d, "pool.disruption_ended"), hold_seconds + 10, interval=0.1, what="the end")
        assert ended["pool"] == "gpu" and ended["reason"] == "timeout" and ended["escalation"] == hold.escalation
        assert hold.until_ms <= _ms(ended["id"]) <= hold.until_ms + scaled(SLACK) * 1000
        for j in silent_jobs:
            state(d, j, "queued", timeout=toleration + 10)
        # their workers, silent for longer than the hold and now without leases, are forgotten; whether or not that
        # has happened yet, the pool is not held again nor escalated again
        wait_for(
            lambda: {e["worker"] for e in events(d, "worker.forgotten")} >= {"gpu1", "gpu2"},
            10,
            interval=0.1,
            what="the silent workers to be forgotten",
        )
        _passes(redis_client, namespace, 10)
        assert disruption.holds().get("gpu") is None  # one worker left counts: the pool is no longer disrupted
        assert len(_inbox(d)) == 1 and len(_escalations(d)) == 1
        assert len(events(d, "pool.disruption_ended")) == 1
    finally:
        beats.close()


def test_a_blip_shorter_than_toleration_ends_its_hold_recovered_and_requeues_nothing(gpu, disruption):
    d = gpu
    ws = _workers(d, ["gpu0", "gpu1", "gpu2"])
    jobs = _claim_one_each(d, ws)
    beats = Beats(ws[:1])
    try:
        hold = wait_for(lambda: disruption.holds().get("gpu"), GRACE + 10, interval=0.1, what="the hold")
        beats.ws = ws  # the network is back before toleration: the silent workers' next heartbeats renew their leases
        (ended,) = wait_for(lambda: events(d, "pool.disruption_ended"), 10, interval=0.1, what="the end")
        assert ended["reason"] == "recovered" and _ms(ended["id"]) < hold.until_ms
        assert "gpu" not in disruption.holds()
        assert not events(d, "lease.expired")
        assert all(_state(d, j) in ("leased", "running") for j in jobs)
        assert all(w.held for w in ws)  # each worker still holds its job: heartbeats answered `ok`, never `lost`
        assert len(_inbox(d)) == 1
    finally:
        beats.close()


@pytest.mark.parametrize("gone", ["revoked", "expired"])
def test_revoked_and_departed_workers_do_not_count(gpu, disruption, redis_client, namespace, gone):
    d = gpu
    keys = Keys(namespace)
    ws = _workers(d, ["gpu0", "gpu1", "gpu2", "gpu3"])
    jobs = _claim_one_each(d, ws[:3])
    beats = Beats(ws[:1])
    try:
        for w in ws[1:3]:  # they cannot come back
            if gone == "revoked":
                with d.api() as api:
                    api.call("DELETE", f"/v1/tokens/{w.name}")
            else:  # its expiry passed a moment ago, by the daemon's clock
                rec = Token.from_redis(redis_client.hget(keys.tokens(), w.name))
                past = replace(rec, expires_ms=int(time.time() * 1000) - 1000)
                redis_client.hset(keys.tokens(), w.name, past.to_redis())
        # drained (as the provisioner drains an idle worker), holding no lease: once silent it has departed
        assert Scripts(redis_client).run("drain", [keys.worker("gpu3"), keys.events()], ["gpu3", "human:test", "idle"])
        # three of four are silent; had they counted, the pool would be held at grace and its leases kept
        revoked_jobs = [j for j, w in jobs.items() if w in ("gpu1", "gpu2")]

        def back() -> bool:
            assert not disruption.holds() and not _inbox(d), "the pool was held: revoked or departed workers counted"
            return all(_state(d, j) == "queued" for j in revoked_jobs)

        wait_for(back, TOLERATION + 10, interval=0.1, what="the revoked workers' jobs to come back at toleration")

        def listed() -> dict[str, bool]:
            with d.api() as api:
                return {w["name"]: w["reachable"] for w in api.call("GET", "/v1/workers") if w["pool"] == "gpu"}

        # they cannot come back: once silent past grace without a lease, they leave the list (docs/operations.md)
        wait_for(lambda: listed() == {"gpu0": True}, GRACE + 10, interval=0.1, what="the gone workers to leave")
        assert {e["worker"] for e in events(d, "worker.forgotten")} == {"gpu1", "gpu2", "gpu3"}
    finally:
        beats.close()


def test_the_same_pool_silent_without_revokes_is_held(gpu, disruption):
    """The control for the test above: the same pool of four, three silent, none revoked or departed."""
    d = gpu
    ws = _workers(d, ["gpu0", "gpu1", "gpu2", "gpu3"])
    beats = Beats(ws[:1])
    try:
        hold = wait_for(lambda: disruption.holds().get("gpu"), GRACE + 10, interval=0.1, what="the hold")
        assert (hold.silent, hold.total) == (3, 4)
    finally:
        beats.close()


def test_a_daemon_paused_longer_than_grace_during_a_hold_neither_ends_nor_repeats_it(
    gpu, disruption, redis_client, namespace
):
    d = gpu
    ws = _workers(d, ["gpu0", "gpu1", "gpu2"])
    _claim_one_each(d, ws)
    beats = Beats(ws[:1])
    try:
        hold = wait_for(lambda: disruption.holds().get("gpu"), GRACE + 10, interval=0.1, what="the hold")
        d.pause()
        paused = time.monotonic()
        wait_for(lambda: time.monotonic() > paused + GRACE + 1, GRACE + 2)  # the machine slept
        d.resume()
        (_rearmed,) = wait_for(lambda: events(d, "daemon.rearmed"), 10, interval=0.1, what="the re-arm")
        # the re-arm made every worker look alive for grace; the hold neither ended nor began again meanwhile
        _passes(redis_client, namespace, int((GRACE + 1) / 0.2) + 5)
        assert disruption.holds()["gpu"] == hold
        assert not events(d, "pool.disruption_ended")
        assert len(_inbox(d)) == 1 and len(_escalations(d)) == 1
    finally:
        beats.close()


def test_two_passes_at_once_begin_one_hold(gpu, disruption, redis_server, namespace):
    """The real daemon's pass and eight more deciding at once, each on a connection of its own."""
    d = gpu
    ws = _workers(d, ["gpu0", "gpu1", "gpu2"])
    beats = Beats(ws[:1])
    policy = disruption_policy(
        ExecutorConfig(
            renew_seconds=0.5,
            grace_seconds=2,
            toleration_seconds=6,
            request_timeout_seconds=1,
            kill_grace_seconds=0.5,
            pass_seconds=0.2,
        )
    )
    began: list[str] = []
    start = threading.Barrier(8)

    def decide() -> None:
        client = redis.Redis.from_url(redis_server.url)
        mine = DisruptionState(client, Keys(namespace))
        start.wait()
        end = time.monotonic() + GRACE + 10
        while time.monotonic() < end and "gpu" not in mine.holds():
            began.extend(mine.decide(policy).began)
        began.extend(mine.decide(policy).began)
        client.close()

    try:
        threads = [threading.Thread(target=decide) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GRACE + 20)
        assert "gpu" in disruption.holds()
        assert len(began) <= 1  # the daemon's pass may have been the one
        assert len(_inbox(d)) == 1 and len(_escalations(d)) == 1
    finally:
        beats.close()


def test_a_worker_silent_past_the_holds_length_without_leases_is_forgotten(gpu):
    d = gpu
    (w,) = _workers(d, ["gpu5"])

    def listed() -> dict:
        with d.api() as api:
            return {v["name"]: v for v in api.call("GET", "/v1/workers")}

    silent_since = time.monotonic()
    wait_for(lambda: not listed()["gpu5"]["reachable"], GRACE + 5, interval=0.1, what="gpu5 to be unreachable")
    assert time.monotonic() - silent_since < HOLD  # listed while it could still come back
    wait_for(lambda: "gpu5" not in listed(), HOLD + 10, interval=0.2, what="gpu5 to be forgotten")
    assert time.monotonic() - silent_since >= HOLD - 1
    (gone,) = [e for e in events(d, "worker.forgotten") if e["worker"] == "gpu5"]
    assert gone["by"] == "service:daemon"
    w.register()  # it came back after all: it registers again, as a worker told it is unknown does
    assert listed()["gpu5"]["reachable"]
