"""Heartbeats of many workers in one script (`heartbeat.lua`), on a real redis-server."""

from __future__ import annotations

import pytest

from piloop_common.errors import NotFound
from piloop_server.state.generation import GenerationRecord, ensure_generation
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import Beat, Lease, Timings


@pytest.fixture
def leases(redis_client, namespace, tmp_path):
    keys = Keys(namespace)
    ensure_generation(redis_client, keys, GenerationRecord(tmp_path / "gen.json"), 0)
    return LeasesState(redis_client, keys, Timings(grace_ms=5000, toleration_ms=20000, max_lost=2))


def _workers(leases: LeasesState, n: int) -> list[str]:
    names = [f"w{i}" for i in range(n)]
    for name in names:
        leases.register(name, "p", "", "cas1", {"load": 0.1}, protocol=1, by=f"worker:{name}")
    return names


def _leased(leases: LeasesState, worker: str, job: str) -> Lease:
    leases.enqueue(job, "evaluation", "p", {"argv": ["true"]}, by="human:t")
    (lease,) = leases.claim(worker, "p", "evaluation", slots=1, image="").leases
    return lease


def test_one_script_answers_each_worker_and_refuses_only_the_unknown(leases):
    _workers(leases, 2)
    lease = _leased(leases, "w0", "j1")
    answers = leases.heartbeats(
        [
            Beat("w0", {"load": 0.5}, [lease, Lease("ghost-job", "7")]),
            Beat("ghost", {}, []),
            Beat("w1", {"load": 0.2}, []),
        ]
    )
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
