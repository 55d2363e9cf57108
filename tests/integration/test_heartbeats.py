"""Heartbeats of many workers in one script (`heartbeat.lua`), and the server's gathering of them into batches
(`api/beats.py`), on a real redis-server."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from piloop_common.errors import NotFound, Unavailable
from piloop_server.api.beats import Beats
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import Beat, Lease, Leases, Timings
from piloop_server.state.scripts import AsyncScripts
from tests.helpers.redis import free_port


@pytest.fixture
def leases(redis_client, namespace, tmp_path):
    keys = Keys(namespace)
    ensure_generation(redis_client, keys, GenerationRecord(tmp_path / "gen.json"), 0)
    return Leases(redis_client, keys, Timings(grace_ms=5000, toleration_ms=20000, max_lost=2))


def _workers(leases: Leases, n: int) -> list[str]:
    names = [f"w{i}" for i in range(n)]
    for name in names:
        leases.register(name, "p", "", "cas1", {"load": 0.1}, protocol=1, by=f"worker:{name}")
    return names


def _leased(leases: Leases, worker: str, job: str) -> Lease:
    leases.enqueue(job, "evaluation", "p", {"argv": ["true"]}, by="human:t")
    (lease,) = leases.claim(worker, "p", "evaluation", slots=1, image="").leases
    return lease


def test_one_script_answers_each_worker_and_refuses_only_the_unknown(leases):
    _workers(leases, 2)
    lease = _leased(leases, "w0", "j1")
    answers = leases.heartbeats([Beat("w0", {"load": 0.5}, [lease, Lease("ghost-job", "7")]), Beat("ghost", {}, []),
                                 Beat("w1", {"load": 0.2}, [])])
    (now0, st0), unknown, (now1, st1) = answers
    assert now0 == now1 > 0
    assert st0 == {"j1": "ok", "ghost-job": "lost"} and st1 == {}
    assert isinstance(unknown, NotFound) and "ghost" in str(unknown) and "register again" in str(unknown)
    r, k = leases.r, leases.k
    assert r.hget(k.job("j1"), "state") == b"running"  # the first beat of a leased job starts it
    assert r.hget(k.worker("w1"), "sample") == b'{"load": 0.2}'
    assert not r.exists(k.worker("ghost")) and not r.exists(k.worker_alive("ghost"))
    with pytest.raises(NotFound, match="register again"):
        leases.heartbeat("ghost", {}, [])


def _beats(redis_url: str, leases: Leases, **kw) -> Beats:
    """Beats whose batches go to Redis as one script call, as the server's fast path sends them."""
    scripts = AsyncScripts(redis.asyncio.Redis.from_url(redis_url))
    return Beats(lambda batch: leases.aheartbeats(scripts, batch), **kw)


def test_beats_that_come_together_share_calls_and_each_hears_its_own_answer(leases, redis_server):
    names = _workers(leases, 20)
    lease = _leased(leases, "w3", "j3")

    async def run() -> tuple[list, int]:
        beats = _beats(redis_server.url, leases, window=1.0)
        held = {"w3": [lease]}
        got = await asyncio.gather(*(beats.beat(Beat(n, {"n": n}, held.get(n, []))) for n in [*names, "ghost"]))
        return got, beats.calls

    got, calls = asyncio.run(run())
    # until beats have come often, each goes at once; then the rest wait for company and go together, each hearing
    # its own answer: a worker not registered hears NotFound, the others their statuses
    assert calls <= 6, calls
    assert [a[1] for a in got[:20]] == [{"j3": "ok"} if n == "w3" else {} for n in names]
    assert isinstance(got[20], NotFound) and "ghost" in str(got[20])
    assert leases.r.hget(leases.k.worker("w19"), "sample") == b'{"n": "w19"}'


def test_a_lone_beat_does_not_wait_for_company(leases, redis_server):
    _workers(leases, 1)

    async def run() -> tuple:
        beats = _beats(redis_server.url, leases, window=30.0)
        # a first beat finds no recent beats: it goes at once, not after the (here 30 s) window
        first = await asyncio.wait_for(beats.beat(Beat("w0", {}, [])), 10)
        await asyncio.sleep(0.2)
        return first, await asyncio.wait_for(beats.beat(Beat("w0", {}, [])), 10)

    first, second = asyncio.run(run())
    assert first[1] == {} and second[1] == {}


def test_each_caller_of_a_call_hears_redis_is_down(leases):
    _workers(leases, 1)

    async def run() -> list:
        scripts = AsyncScripts(redis.asyncio.Redis(port=free_port(), socket_connect_timeout=2))
        beats = Beats(lambda batch: leases.aheartbeats(scripts, batch), window=1.0)
        return await asyncio.gather(*(beats.beat(Beat("w0", {}, [])) for _ in range(8)), return_exceptions=True)

    got = asyncio.run(run())
    assert all(isinstance(e, Unavailable) and "Redis cannot be reached" in str(e) for e in got), got
